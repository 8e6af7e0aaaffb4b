"""commdiag p2p without GPUs: ceilings, flags, the matrices, the JSON envelope and the HTML page,
from constructed measurement results (pure functions).  NVML data comes from the real 2x H200
recording (tests/fixtures/h200x2-nvlink/nvml-readings.json); the probe's own records are
constructed in the layout probe.py writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commdiag.errors import CommdiagError
from commdiag.p2p import ceiling, flags, render
from commdiag.p2p.assemble import assemble
from commdiag.p2p.page import build_html
from commdiag.p2p.result import (FAIL, HUNG, INFO, OK, WARN, Ceiling, Check, Gpu, Link, P2PResult, Pair, Settings,
                                 Stat, from_json)
from commdiag.p2p.supervise import JobOutcome

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GEN5 = Link(5, 16, 5, 16, 1, 16)


def st(*vals) -> Stat:
    return Stat.of(vals)


def pcie_pair(a, b, ab=(54.0, 54.5, 55.0), ba=(54.0, 54.6, 55.1), host=(40.0, 40.5, 41.0), **kw) -> Pair:
    base = dict(status=OK, peer_ab=True, peer_ba=True, nvml_p2p={"READ": "OK", "WRITE": "OK"}, path="PHB",
                check_ab=Check(1000, 0), check_ba=Check(1000, 0), p2p_ab=st(*ab), p2p_ba=st(*ba),
                p2p_bidir=st(100.0, 101.0, 102.0), host_ab=st(*host), host_ba=st(*host),
                host_bidir=st(70.0, 71.0, 72.0), lat_p2p_ab=st(0.40, 0.41, 0.42), lat_p2p_ba=st(0.40, 0.41, 0.42),
                lat_host_ab=st(13.0, 14.0, 15.0), lat_host_ba=st(13.0, 14.0, 15.0),
                ceiling=ceiling.pair_ceiling(GEN5, GEN5))
    base.update(kw)
    return Pair(a, b, **base)


def gpu(i, **kw) -> Gpu:
    base = dict(status=OK, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", h2d=st(55.0, 55.2, 55.4),
                d2h=st(54.0, 54.2, 54.4), link=GEN5, ceiling=ceiling.gpu_ceiling(GEN5), replays_before=3,
                replays_after=3)
    base.update(kw)
    return Gpu(i, **base)


def codes(fs) -> list[tuple[str, str, str]]:
    return sorted((f.code, f.severity, f.subject) for f in fs)


# --------------------------------------------------------------------------- ceilings

def test_pcie_gen5_x16_is_63_gb_s_one_way_and_a_pair_takes_the_slower_end():
    assert ceiling.pcie_gbps(5, 16) == pytest.approx(63.0, abs=0.1)
    assert ceiling.pcie_gbps(4, 16) == pytest.approx(31.5, abs=0.1)
    assert ceiling.pcie_gbps(3, 8) == pytest.approx(7.88, abs=0.01)
    assert ceiling.pcie_gbps(None, 16) is None and ceiling.pcie_gbps(9, 16) is None
    c = ceiling.pair_ceiling(GEN5, Link(4, 8, 5, 16))
    assert c.gbps == pytest.approx(15.75, abs=0.01)
    assert "gen4 x8" in c.basis and "slower end" in c.basis


def test_ceiling_falls_back_to_the_maximum_without_a_reading_under_load():
    c = ceiling.gpu_ceiling(Link(None, None, 5, 16))
    assert c.gbps == pytest.approx(63.0, abs=0.1) and "maximum" in c.basis


def test_nvlink_ceiling_counts_links_by_generation():
    c = ceiling.pair_ceiling(GEN5, GEN5, nvlinks=18, capability="9.0")
    assert c.gbps == 450 and "x18" in c.basis
    assert ceiling.pair_ceiling(GEN5, GEN5, nvlinks=18, capability="10.0").gbps == 900
    assert ceiling.pair_ceiling(GEN5, GEN5, nvlinks=4, capability=None) is None  # unknown generation: no guess


# --------------------------------------------------------------------------- flags

def test_healthy_pcie_pair_raises_no_flag():
    fs = flags.evaluate((gpu(0), gpu(1)), (pcie_pair(0, 1),), Settings())
    assert fs == ()


def test_below_ceiling_needs_every_sample_below_the_threshold():
    s = Settings(min_fraction=0.6)  # 0.6 x 63.0 = 37.8 GB/s
    low = pcie_pair(0, 1, ab=(20.0, 21.0, 22.0))
    assert ("below-ceiling", WARN, "0->1") in codes(flags.evaluate((), (low,), s))
    noisy = pcie_pair(0, 1, ab=(20.0, 21.0, 40.0))  # one sample above the limit: noise could explain it
    assert not [f for f in flags.evaluate((), (noisy,), s) if f.code == "below-ceiling"]


def test_p2p_slower_than_host_needs_disjoint_ranges_and_a_margin():
    slow = pcie_pair(0, 1, ab=(9.8, 9.9, 10.0), ba=(9.8, 9.9, 10.0), host=(21.0, 22.0, 23.0))
    got = codes(flags.evaluate((), (slow,), Settings(min_fraction=0.1)))
    assert ("p2p-slower-than-host", WARN, "0->1") in got and ("p2p-slower-than-host", WARN, "1->0") in got
    overlap = pcie_pair(0, 1, ab=(20.0, 21.0, 22.5), ba=(20.0, 21.0, 22.5), host=(21.5, 22.0, 23.0))
    assert not [f for f in flags.evaluate((), (overlap,), Settings(min_fraction=0.1))
                if f.code == "p2p-slower-than-host"]


def test_p2p_latency_above_host_latency_is_flagged():
    p = pcie_pair(0, 1, lat_p2p_ab=st(20.0, 21.0, 22.0))
    f = [f for f in flags.evaluate((), (p,), Settings()) if f.code == "p2p-slower-than-host"]
    assert [x.subject for x in f] == ["0->1"] and "latency" in f[0].evidence


def test_asymmetric_directions():
    p = pcie_pair(0, 1, ab=(40.0, 40.5, 41.0), ba=(54.0, 54.5, 55.0))
    f = [f for f in flags.evaluate((), (p,), Settings()) if f.code == "asymmetric"]
    assert len(f) == 1 and f[0].evidence.startswith("0->1 40.5 GB/s (40.0-41.0, n=3) vs 1->0")
    close = pcie_pair(0, 1, ab=(50.0, 50.5, 51.0), ba=(54.0, 54.5, 55.0))  # 7% apart: within the margin
    assert not [f for f in flags.evaluate((), (close,), Settings()) if f.code == "asymmetric"]


def test_one_gpu_slow_to_every_peer_is_named_once():
    pairs = []
    for a in range(4):
        for b in range(a + 1, 4):
            slow = (20.0, 20.5, 21.0)
            pairs.append(pcie_pair(a, b, ab=slow, ba=slow) if 2 in (a, b) else pcie_pair(a, b))
    fs = flags.evaluate(tuple(gpu(i) for i in range(4)), tuple(pairs), Settings(min_fraction=0.1))
    slow_gpu = [f for f in fs if f.code == "slow-gpu"]
    assert [f.subject for f in slow_gpu] == ["GPU 2"]
    assert "H2D 55.2 GB/s (55.0-55.4, n=3)" in slow_gpu[0].evidence


def test_two_gpus_never_name_a_slow_gpu():
    slow = (20.0, 20.5, 21.0)
    fs = flags.evaluate((gpu(0), gpu(1)), (pcie_pair(0, 1, ab=slow, ba=slow),), Settings(min_fraction=0.1))
    assert not [f for f in fs if f.code == "slow-gpu"]


def test_link_below_max_under_load_and_replays():
    g = gpu(0, link=Link(4, 16, 5, 16), replays_before=10, replays_after=12)
    g2 = gpu(1, replays_before=0, replays_after=81)
    got = codes(flags.evaluate((g, g2), (), Settings()))
    assert ("link-below-max", WARN, "GPU 0") in got
    assert ("pcie-replays", WARN, "GPU 0") in got and ("pcie-replays", FAIL, "GPU 1") in got
    idle_only = gpu(0, link=Link(None, None, 5, 16, 1, 16))  # downtrained at idle, no reading under load
    assert not [f for f in flags.evaluate((idle_only,), (), Settings()) if f.code == "link-below-max"]


def test_hung_failed_mismatch_and_no_peer_access():
    hung = Pair(0, 1, status=HUNG, phase="P2P 0->1")
    bad = pcie_pair(0, 2, check_ba=Check(1000, 7, 12))
    nopeer = pcie_pair(1, 2, peer_ab=False, peer_ba=False, nvml_p2p={"READ": "CHIPSET_NOT_SUPPORTED",
                                                                     "WRITE": "CHIPSET_NOT_SUPPORTED"},
                       p2p_ab=None, p2p_ba=None, p2p_bidir=None, lat_p2p_ab=None, lat_p2p_ba=None)
    disagree = pcie_pair(0, 3, peer_ab=True, peer_ba=True, nvml_p2p={"READ": "NOT_SUPPORTED",
                                                                      "WRITE": "NOT_SUPPORTED"})
    fs = flags.evaluate((), (hung, bad, nopeer, disagree), Settings(pair_timeout_s=12))
    got = codes(fs)
    assert ("hung", FAIL, "pair 0-1") in got
    assert ("data-mismatch", FAIL, "2->0") in got
    assert ("no-peer-access", INFO, "pair 1-2") in got
    assert ("peer-access-disagrees", WARN, "pair 0-3") in got
    h = next(f for f in fs if f.code == "hung")
    assert "12 s in P2P 0->1" in h.evidence and "ACSCtl" in h.action
    assert fs[0].severity == FAIL and fs[-1].severity == INFO  # fail first


def test_host_copies_below_the_links_ceiling():
    g = gpu(0, h2d=st(20.0, 20.5, 21.0))
    assert ("below-ceiling", WARN, "GPU 0 H2D") in codes(flags.evaluate((g,), (), Settings()))


# --------------------------------------------------------------------------- the matrices

def eight_gpus() -> P2PResult:
    """8 GPUs with the widest values the cells hold: NVLink-sized numbers, big spreads, every status."""
    gpus = tuple(gpu(i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition with a very long name " * 2,
                     bus_id=f"00000000:{0x18 + i:02x}:00.0", nvml_index=7 - i, local=st(3000.0, 3500.0, 3900.0),
                     lat_h2d=st(1.5, 2.0, 2.5), lat_d2h=st(1.5, 2.0, 2.5), host_bidir=st(100, 101, 102),
                     replays_before=0, replays_after=1000 if i == 5 else 0,
                     link=Link(4, 8, 5, 16) if i == 3 else GEN5) for i in range(8))
    pairs = []
    for a in range(8):
        for b in range(a + 1, 8):
            if (a, b) == (0, 4):
                pairs.append(Pair(a, b, status=HUNG, phase="P2P 0->4"))
            elif (a, b) == (1, 5):
                pairs.append(pcie_pair(a, b, ab=(9.9, 100.0, 999.9), ba=(0.001, 0.002, 0.003), path="SYS"))
            elif 3 in (a, b):
                pairs.append(pcie_pair(a, b, ab=(20.0, 20.5, 21.0), ba=(20.0, 20.5, 21.0), path="NV18"))
            else:
                pairs.append(pcie_pair(a, b, ab=(388.0, 390.1, 391.0), ba=(1000.0, 1234.5, 1500.0), path="NODE"))
    gpus_t, pairs_t = gpus, tuple(pairs)
    return P2PResult(gpus_t, pairs_t, flags.evaluate(gpus_t, pairs_t, Settings()),
                     ("a note that is long enough to need wrapping " * 5,), Settings(), {"host": "box"}, 41.5)


def test_eight_gpu_matrices_fit_100_columns():
    res = eight_gpus()
    text = render.render(res)
    lines = text.splitlines()
    assert max(len(l) for l in lines) <= 100, max(lines, key=len)
    assert "HUNG" in text and "GPU7" in text and "Flags:" in text
    header = next(l for l in lines if l.strip().startswith("GPU0") and "GPU7" in l)
    assert len(header.split()) == 8
    # every GPU row of the P2P matrix has 8 cells; the flagged direction is starred
    p2p = lines[lines.index("P2P one way, GB/s (copy engine, row writes to column; * flagged)") + 2:][:8]
    assert all(len(l.split()) == 9 for l in p2p) and any("*" in l for l in p2p)


def test_cell_shows_median_and_spread():
    assert render.cell(st(54.0, 54.8, 55.6)) == "54.8±1%"
    assert render.cell(st(0.40, 0.41, 0.42)) == "0.410±2%"
    assert render.cell(None) == "-"


def test_one_gpu_says_pair_tests_need_two():
    hello = {"count": 1, "devices": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "bus_id": None}],
             "peer": [[None]], "nvml_error": "NVMLError_LibraryNotFound"}
    rec = {"h2d": [55.0, 55.1, 55.2], "d2h": [55.0, 55.2, 55.3], "link_load": {"0": [[5, 16]]}}
    res = assemble(hello, {"gpu0": JobOutcome("gpu0", OK, rec)}, Settings())
    text = render.render(res)
    assert "need 2 or more GPUs" in text and "P2P one way" not in text
    assert max(len(l) for l in text.splitlines()) <= 100


# --------------------------------------------------------------------------- assembling probe records

def _hello_2x_h200():
    nvml = json.loads((FIXTURES / "h200x2-nvlink" / "nvml-readings.json").read_text())
    # CUDA numbers the GPUs the other way round here (CUDA_VISIBLE_DEVICES=1,0): joined by UUID
    return {"count": 2, "torch": "2.11.0+cu130", "cuda": "13.0", "driver": nvml["driver"],
            "devices": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-bbbb", "bus_id": None, "capability": "9.0"},
                        {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-aaaa", "bus_id": None, "capability": "9.0"}],
            "peer": [[None, True], [True, None]], "nvml": nvml,
            "nvml_extras": [{"index": 0, "uuid": "GPU-AAAA", "replays": 0}, {"index": 1, "uuid": "GPU-bbbb",
                                                                              "replays": 5}]}


def test_assemble_joins_cuda_and_nvml_by_uuid_and_reads_nvlink_from_the_recording():
    pair_rec = {"peer_ab": True, "peer_ba": True, "check_ab": {"bytes": 100, "mismatches": 0},
                "check_ba": {"bytes": 100, "mismatches": 0}, "p2p_ab": [380.0, 385.0, 390.0],
                "p2p_ba": [381.0, 386.0, 391.0], "link_load": {"0": [[1, 16], [5, 16]], "1": [[5, 16]]}}
    outcomes = {"gpu0": JobOutcome("gpu0", OK, {"h2d": [55.0]}), "gpu1": JobOutcome("gpu1", OK, {}),
                "0-1": JobOutcome("0-1", OK, pair_rec, wall_s=0.8),
                "final": JobOutcome("final", OK, {"replays": {"0": 0, "1": 9}})}
    res = assemble(_hello_2x_h200(), outcomes, Settings())
    g0, g1 = res.gpus
    assert (g0.nvml_index, g1.nvml_index) == (1, 0)
    assert g0.bus_id == "00000000:00:07.0"
    assert (g0.link.gen, g0.link.width) == (5, 16)  # the best reading under load, not the idle gen 1
    assert (g0.replays_before, g0.replays_after, g0.replay_delta) == (5, 9, 4)
    p = res.pairs[0]
    assert p.nvlinks == 18 and p.path == "NV18" and p.nvml_p2p["NVLINK"] == "OK"
    assert p.ceiling.gbps == 450
    assert [f.code for f in res.flags] == ["pcie-replays"]


def test_assemble_marks_what_never_ran():
    res = assemble(_hello_2x_h200(), {"gpu0": JobOutcome("gpu0", HUNG, phase="host to GPU")}, Settings())
    assert res.gpus[0].status == HUNG and res.gpus[1].status == "not-run" and res.pairs[0].status == "not-run"
    assert res.gpus[0].replays_after is None


# --------------------------------------------------------------------------- JSON and HTML

def test_json_round_trip_and_refusals(tmp_path):
    res = eight_gpus()
    data = json.loads(json.dumps(res.to_json()))
    assert data["format"] == "commdiag-p2p" and data["version"] == 1
    back = from_json(data)
    assert back == res
    with pytest.raises(CommdiagError, match="version: 2 is not one this commdiag reads"):
        from_json({**data, "version": 2}, "x.json")
    with pytest.raises(CommdiagError, match="format: 'commdiag-run' is not a commdiag p2p result"):
        from_json({**data, "format": "commdiag-run"}, "x.json")
    data["gpus"][0]["added_later"] = 1  # a newer minor addition is ignored
    assert from_json(data).gpus[0] == res.gpus[0]


def test_html_page_has_heatmaps_plotly_once_and_escapes_names():
    res = eight_gpus()
    hostile = res.gpus[0].__class__(**{**res.gpus[0].__dict__, "name": "<script>alert(1)</script>"})
    res = P2PResult((hostile,) + res.gpus[1:], res.pairs, res.flags, res.notes, res.settings, res.environment,
                    res.wall_s)
    html = build_html(res)
    assert html.count("<script>alert(1)</script>") == 0 and "&lt;script&gt;alert(1)" in html
    assert html.count("plotly.js v") <= 2  # the bundle's own banner; embedded once
    figs = json.loads(html.split('<script id="figs" type="application/json">')[1].split("</script>")[0])
    assert [f["data"][0]["type"] for f in figs] == ["heatmap"] * 6
    assert figs[0]["data"][0]["text"][0][4] == "HUNG"


def test_one_h200_from_the_recordings():
    """The 1x H200 machine: topology from detect --json's NVML readings, UUID and replay counter from
    the 2026-12-01 capture (both recorded there); the host-link job's record constructed."""
    detect = json.loads((FIXTURES / "h200x1" / "detect.json").read_text())
    cap = json.loads((FIXTURES / "h200x1" / "nvml-2026-12-01.json").read_text())["gpus"][0]
    hello = {"count": 1, "torch": "2.11.0+cu130", "cuda": "13.0", "driver": cap.get("driver"),
             # torch's uuid has no "GPU-" prefix; the probe adds it (probe.py, CudaBackend.hello)
             "devices": [{"index": 0, "name": "NVIDIA H200", "uuid": cap["uuid"], "bus_id": None,
                          "capability": "9.0"}],
             "peer": [[None]], "nvml": detect["nvml_readings"],
             "nvml_extras": [{"index": 0, "uuid": cap["uuid"], "replays": cap["pcie_replay_counter"]}]}
    rec = {"h2d": [54.1, 54.3, 54.2], "d2h": [55.0, 55.2, 55.1], "local": [4300.0, 4310.0, 4290.0],
           "lat_h2d": [2.0, 2.1, 2.05], "link_load": {"0": [[5, 16], [5, 16]]}, "link_idle": {"0": [5, 16]}}
    outcomes = {"gpu0": JobOutcome("gpu0", OK, rec, wall_s=1.2),
                "final": JobOutcome("final", OK, {"replays": {"0": cap["pcie_replay_counter"]}})}
    res = assemble(hello, outcomes, Settings())
    g = res.gpus[0]
    assert g.nvml_index == 0 and g.bus_id == "00000000:00:06.0"
    assert (g.link.gen, g.link.width, g.link.gen_max, g.link.width_max) == (5, 16, 5, 16)
    assert g.ceiling.basis == "PCIe gen5 x16 (under load)" and g.replay_delta == 0
    assert res.pairs == () and res.flags == () and res.ok
    text = render.render(res)
    assert "0   g5x16/g5x16" in text and "54.2±0%" in text and "+0" in text
    assert "need 2 or more GPUs" in text and max(len(l) for l in text.splitlines()) <= 100


def test_html_page_draws_every_heatmap_in_a_browser(tmp_path):
    """Headless Chromium loads the page: six heatmaps drawn, no script error (skips without chromium,
    as the report tests do; CI requires it)."""
    from test_report import assert_drawn, render as browse

    page = tmp_path / "p2p.html"
    page.write_text(build_html(eight_gpus()))
    dom, console = browse(page)
    assert_drawn(dom, console, 6)
