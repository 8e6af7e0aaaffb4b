"""explain: NCCL's TUNING lines parsed from a real 2x H200 recording, joined per config and size."""

from __future__ import annotations

from pathlib import Path

from commdiag.measure import explain
from commdiag.nccl import ncclog

FIXTURES = Path(__file__).parent / "fixtures" / "h200x2-nvlink"
TUNING_LOG = FIXTURES / "nccl-debug-init-env-tuning-defaults.log"


def test_parse_tuning_new_format_from_recording():
    calls = ncclog.parse_tuning(TUNING_LOG.read_text())
    assert list(calls) == [662]  # only rank 0's TUNING lines fit in the recorded 60 kB
    first = calls[662][0]
    assert (first.collective, first.bytes, first.algo, first.proto, first.channels) == ("AllReduce", 4, "Ring", "LL", 1)
    assert {(c.algo, c.proto) for c in calls[662]} == {("Ring", "LL")}  # defaults on NVLink up to 57 kB
    assert len(calls[662]) == 489


def test_parse_tuning_old_numeric_format():
    text = "h:7:7 [1] NCCL INFO AllReduce: 1048576 Bytes -> Algo 0 proto 2 time 35.500000\n"
    (choice,) = ncclog.parse_tuning(text)[7]
    assert (choice.algo, choice.proto, choice.channels) == ("Tree", "Simple", None)


def test_choices_by_size_from_recording():
    got = explain.choices_by_size(TUNING_LOG.read_text(), [14336, 28672, 999])
    assert got["14336"] == {"algo": "Ring", "proto": "LL", "channels": 1, "calls": 443}
    assert got["28672"]["channels"] == 3
    assert "999" not in got  # a size NCCL never saw is absent, not invented


def _choice(algo, proto, ch=4):
    return {"algo": algo, "proto": proto, "channels": ch, "calls": 3}


def test_notes_flag_settings_that_restate_the_default():
    configs = [
        {"name": "default", "overrides": {}},
        {"name": "ll", "overrides": {"NCCL_PROTO": "LL"}},
        {"name": "ring", "overrides": {"NCCL_ALGO": "Ring"}},
        {"name": "ll128", "overrides": {"NCCL_PROTO": "LL128"}},
    ]
    default = {"14336": _choice("Ring", "LL"), "917504": _choice("Ring", "LL"), "1835008": _choice("Ring", "Simple")}
    explained = {
        "default": {"sizes": default},
        "ll": {"sizes": {**default, "1835008": _choice("Ring", "LL")}},
        "ring": {"sizes": default},
        "ll128": {"sizes": {k: _choice("Ring", "LL128") for k in default}},
    }
    notes = {n["config"]: n["text"] for n in explain.notes(configs, explained)}
    assert "already chose LL at 2 of 3 sizes (14.3 KB to 918 KB)" in notes["ll"]
    assert "can only matter at the others" in notes["ll"] and "differed from default at 1 size" in notes["ll"]
    assert "already chose Ring at every size here, so it changes nothing" in notes["ring"]
    assert "changes every size" in notes["ll128"] and "differed from default at 3 size" in notes["ll128"]
    assert "default" not in notes


def test_render_shows_each_config_and_status():
    data = {"nccl_version": "2.28.9", "configs": {
        "default": {"status": "ok", "sizes": {"14336": _choice("Ring", "LL", 1)}},
        "tree": {"status": "failed", "sizes": {}}}, "notes": [{"config": "tree", "text": "x"}]}
    text = explain.render(data, [{"bytes": 14336, "tokens": 1}])
    assert "Ring/LL/1" in text and "failed" in text and "NCCL 2.28.9" in text and "note [tree]: x" in text
