"""Hostile input never reaches a generated file or runs unbounded.

Every generated line format (profile.env, systemd Environment= and EnvironmentFile=, nccl.conf,
the Python hook) follows one rule: values with control characters are refused, free text in a
comment is escaped.  Specs are bounded and refuse duplicate keys; error messages never quote a
huge value whole.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from commdiag.install import hooktext, systemd
from commdiag.nccl import ncclvars
from commdiag.formats import profile
from commdiag.errors import CommdiagError, SpecError, brief, terminal_safe
from commdiag.formats.spec import load_spec, resolve

from conftest import one_message, run_cli, write_spec

HOSTILE = ["x\n$(touch PWNED)\nNCCL_ALGO=Tree\n#", "run3\rNCCL_PROTO=LL128", "a\x1b]0;title\x07b",
           "a\u2028NCCL_ALGO=Tree", "a\x85b", "tab\there"]


# --------------------------------------------------------------------------- profile.env

@pytest.mark.parametrize("text", HOSTILE)
def test_profile_meta_is_one_comment_line_and_sourcing_runs_nothing(tmp_path, text):
    prof = profile.Profile({"NCCL_PROTO": "LL"}, {"source": f"reports/{text} (band {text}: config {text})",
                                                  "band": text})
    rendered = prof.render()
    assert rendered.count("\n") == 4 and all(line.startswith("#") for line in rendered.splitlines()[:3])
    path = tmp_path / "profile.env"
    profile.save(path, prof)
    out = subprocess.run(["sh", "-c", "set -a; . ./profile.env; env"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "PWNED").exists()
    assert "NCCL_PROTO=LL" in out.stdout.splitlines()
    assert not any(l.startswith("NCCL_ALGO=") for l in out.stdout.splitlines())
    assert profile.load(path).settings == {"NCCL_PROTO": "LL"}


@pytest.mark.parametrize("value", ["LL\nNCCL_ALGO=Tree", "LL\r", "a\x00b", "a\u2028b", "x" * 5000])
def test_every_generated_format_refuses_unsafe_values(value):
    settings = {"NCCL_DEBUG_FILE": value}
    for make in (lambda: profile.Profile(settings).render(),
                 lambda: systemd.dropin_text(settings, meta={}),
                 lambda: systemd.env_file_text(settings, meta={}),
                 lambda: hooktext.nccl_conf_block(settings, meta={}),
                 lambda: hooktext.hook_block(settings, override=False, meta={})):
        with pytest.raises(CommdiagError) as e:
            make()
        assert len(str(e.value)) < 400


@pytest.mark.parametrize("text", HOSTILE)
def test_meta_comments_of_every_format_stay_one_line(text):
    meta = {"source": text}
    for rendered in (systemd.dropin_text({"NCCL_PROTO": "LL"}, meta=meta),
                     systemd.env_file_text({"NCCL_PROTO": "LL"}, meta=meta),
                     hooktext.nccl_conf_block({"NCCL_PROTO": "LL"}, meta=meta),
                     hooktext.hook_block({"NCCL_PROTO": "LL"}, override=False, meta=meta)):
        for line in rendered.split("\n"):
            assert not any(c in line for c in "\r\x1b\x85\u2028\x00"), line
        assert not any(l.startswith("NCCL_ALGO") for l in rendered.splitlines())


@pytest.mark.parametrize("text, words", [
    ("# commdiag-profile 1\nNCCL_PROTO=LL\rNCCL_ALGO=Tree\n", "carriage return"),
    ("# commdiag-profile 1\r\nNCCL_PROTO=LL\r\n", "carriage return"),
    ("# commdiag-profile 1\nNCCL_PROTO=LL\x0bNCCL_ALGO=Tree\n", "control character"),
    ("# commdiag-profile 1\nNCCL_PROTO=LL touch\n", "2 words"),
    ('# commdiag-profile 1\nNCCL_PROTO="$(touch x)"\n', "expand"),
    ("# commdiag-profile 1\nNCCL_PROTO=`id`\n", "expand"),
])
def test_profile_parse_refuses_what_sh_reads_differently(text, words):
    with pytest.raises(CommdiagError, match=words):
        profile.parse(text, "p.env")


def test_profile_parse_accepts_bom_and_single_quoted_dollar():
    p = profile.parse("\ufeff# commdiag-profile 1\nNCCL_DEBUG_FILE='/tmp/$x'\n")
    assert p.settings == {"NCCL_DEBUG_FILE": "/tmp/$x"}


def test_profile_round_trip_of_quoted_value():
    prof = profile.Profile({"NCCL_DEBUG_FILE": "/tmp/a b/$HOME/'q'"}, {"source": "r"})
    assert profile.parse(prof.render()).settings == prof.settings


# --------------------------------------------------------------------------- names in specs

def _err(tmp_path, **kw) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path / "s.yaml", **kw))
    return e.value


@pytest.mark.parametrize("bands", [{"x\n$(touch P)\n#": [1, 64]}, {"a/b": [1, 2]}, {"": [1, 2]},
                                   {"b" * 65: [1, 2]}, {"a b": [1, 2]}, {5: [1, 2]}])
def test_band_names_are_a_plain_charset(tmp_path, bands):
    e = _err(tmp_path, bands=bands)
    assert e.field.startswith("bands.") and "band names" in e.problem and "\n" not in str(e)


@pytest.mark.parametrize("name", ["a" * 300, "x/y", "..", "run3\nNCCL_PROTO=LL128", "a b", ""])
def test_spec_name_is_a_plain_charset(tmp_path, name):
    e = _err(tmp_path, name=name)
    assert e.field == "name" and "\n" not in str(e)


@pytest.mark.parametrize("cname", ["a\x1b[2Jb", "a\rb", "a\x9bb", "c" * 121])
def test_config_names_without_control_characters(tmp_path, cname):
    e = _err(tmp_path, configs={cname: {"NCCL_PROTO": "LL"}})
    assert "config names" in e.problem and "\x1b" not in str(e)


# --------------------------------------------------------------------------- bounds

@pytest.mark.parametrize("kw, field", [
    ({"timeout_s": float("nan")}, "timeout_s"), ({"timeout_s": float("inf")}, "timeout_s"),
    ({"timeout_s": 10**9}, "timeout_s"), ({"window_us": float("nan")}, "window_us"),
    ({"trials": 100_000_000}, "trials"), ({"iters": 10**9}, "iters"), ({"warmup": 10**9}, "warmup"),
    ({"batch": 10**9}, "batch"), ({"batch": "many"}, "batch"),
    ({"nproc_per_node": 1000}, "nproc_per_node"), ({"nnodes": 10**6, "rdzv_endpoint": "h:1"}, "nnodes"),
    ({"sizes": {"bytes": [1 << 40]}}, "sizes.bytes[0]"),
    ({"sizes": {"bytes": list(range(4, 4 * 1200, 4))}}, "sizes"),
    ({"grid": {"NCCL_MIN_NCHANNELS": list(range(1, 28)), "NCCL_MAX_NCHANNELS": list(range(1, 28)),
               "NCCL_PROTO": ["LL", "LL128", "Simple"] * 9}}, "grid"),
    ({"configs": {f"c{i}": {"NCCL_PROTO": "LL"} for i in range(200)}, "trials": 200}, "trials"),
    ({"rdzv_endpoint": "h:99999", "nnodes": 2}, "rdzv_endpoint"),
    ({"rdzv_endpoint": "h:\u0663\u0663", "nnodes": 2}, "rdzv_endpoint"),
    ({"rdzv_endpoint": "h:0", "nnodes": 2}, "rdzv_endpoint"),
    ({"rdzv_endpoint": ":29500", "nnodes": 2}, "rdzv_endpoint"),
    ({"base_env": {"NCCL_DEBUG_FILE": "x" * 200_000}}, "base_env.NCCL_DEBUG_FILE"),
    ({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"), ({"description": "d" * 20_000}, "description"),
])
def test_numeric_fields_are_bounded(tmp_path, kw, field):
    t0 = time.monotonic()
    e = _err(tmp_path, **kw)
    assert e.field == field, str(e)
    assert len(str(e)) < 400 and time.monotonic() - t0 < 5


def test_allow_large_lifts_the_soft_caps_only(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", trials=2000, allow_large=True))
    assert spec.trials == 2000
    assert _err(tmp_path, timeout_s=float("inf"), allow_large=True).field == "timeout_s"
    assert _err(tmp_path, nproc_per_node=1000, allow_large=True).field == "nproc_per_node"


def test_legal_endpoint_accepted(tmp_path):
    assert load_spec(write_spec(tmp_path / "s.yaml", nnodes=2, rdzv_endpoint="node1:29500")).nnodes == 2


@pytest.mark.parametrize("text, words", [
    ("name: t\nname: u\n", "duplicate key 'name' (first on line 1)"),
    ("name: t\nconfigs:\n  a: {NCCL_PROTO: LL}\n  a: {NCCL_PROTO: Simple}\n", "duplicate key 'a'"),
    ("name: t\nbase_env: {NCCL_PROTO: LL, NCCL_PROTO: Simple}\n", "duplicate key 'NCCL_PROTO'"),
    ("name: t\ntrials: 3\ntrials: 5\n", "duplicate key 'trials'"),
])
def test_duplicate_yaml_keys_refused(tmp_path, text, words):
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match="line") as e:
        load_spec(p)
    assert words in str(e.value)


def test_yaml_merge_keys_still_override(tmp_path):
    p = write_spec(tmp_path / "s.yaml")
    p.write_text(p.read_text() + "configs:\n  a: &a {NCCL_PROTO: LL}\n  b: {<<: *a, NCCL_PROTO: Simple}\n")
    assert load_spec(p).config("b").overrides == {"NCCL_PROTO": "Simple"}


def test_alias_bomb_message_is_short_and_fast(tmp_path):
    bomb = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, (prev, cur) in enumerate(zip("abcdefgh", "bcdefghi")):
        bomb.append(f"{cur}: &{cur} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    p = tmp_path / "bomb.yaml"
    p.write_text("name: t\nbackend: gloo\nsizes: {bytes: [4096]}\nx:\n"
                 + "".join(f"  {l}\n" for l in bomb) + "description: *i\n")
    t0 = time.monotonic()
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert time.monotonic() - t0 < 5 and len(str(e.value)) < 600


def test_non_utf8_and_deep_nesting_are_one_error(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError, match="UTF-8"):
        load_spec(p)
    p.write_text("name: t\ndescription: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SpecError):
        load_spec(p)


def test_a_huge_integer_literal_is_one_error(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("name: t\nseed: " + "9" * 5000 + "\n")
    with pytest.raises(SpecError, match="not a usable value"):
        load_spec(p)
    with pytest.raises(SpecError):
        load_spec(write_spec(tmp_path / "s.yaml"), ["seed=" + "9" * 5000])


def test_set_into_empty_configs(tmp_path):
    p = write_spec(tmp_path / "s.yaml")
    p.write_text(p.read_text() + "configs:\n")
    spec = load_spec(p, ["configs.a.NCCL_PROTO=LL"])
    assert spec.config("a").overrides == {"NCCL_PROTO": "LL"}


def test_cli_spec_errors_are_one_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"name: t\ntrials: 3\ntrials: 4\n")
    r = run_cli("sweep", p, "--out", tmp_path / "run", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "duplicate key 'trials'" in one_message(r.stderr)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- helpers

def test_brief_and_terminal_safe():
    nested = [[["x" * 10_000] * 1000] * 1000] * 1000
    assert len(brief(nested)) < 200 and len(brief("y" * 10**6)) < 100
    assert terminal_safe("a\x1b]0;t\x07\x9bb\n\tc") == "a\\x1b]0;t\\x07\\x9bb\n\tc"


def test_ncclvars_refuses_control_characters_and_huge_values():
    assert ncclvars.check_setting("NCCL_DEBUG_FILE", "a\rb")[0]
    assert ncclvars.check_setting("NCCL_DEBUG_FILE", "a" * 5000)[0]
    assert ncclvars.check_setting("X" * 10**6 + "-", "1")[0].__len__() < 200
