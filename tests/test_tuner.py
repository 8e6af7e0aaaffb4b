"""commdiag's tuner plugin on CPU: built with the system cc, loaded with ctypes, called as NCCL calls it.

The ctypes structs below are the NCCL tuner ABI (commdiag/tuner/commdiag_tuner_api.h); the
logger is a ctypes callback that records every line, as NCCL's ncclDebugLog would print it.
What would crash (fuzzed rules files) runs in a child process, so a crash fails a test
instead of killing pytest.  Only the hardware is faked: the cost table is a plain float[7][3].
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from ctypes import CFUNCTYPE, POINTER, Structure, byref, c_char_p, c_float, c_int, c_size_t, c_uint64, c_ulong, c_void_p
from pathlib import Path

import pytest

from commdiag.errors import CommdiagError
from commdiag.tuner import build, rules
from conftest import run_cli, one_message, words

TESTS = Path(__file__).resolve().parent
WARN, INFO = 2, 3
SUBSYS_INIT, SUBSYS_TUNING = 0x1, 0x40
COLL = {name: i for i, name in enumerate(rules.COLLS)}
ALGO = {name: i for i, name in enumerate(rules.ALGOS)}
PROTO = {name: i for i, name in enumerate(rules.PROTOS)}
IGNORE = -1.0

# ---- the ABI, as ctypes (one variadic argument: the plugin always logs "%s", text) ----
LOGGER = CFUNCTYPE(None, c_int, c_ulong, c_char_p, c_int, c_char_p, c_char_p)
INIT_V5 = CFUNCTYPE(c_int, POINTER(c_void_p), c_uint64, c_size_t, c_size_t, LOGGER, c_void_p, c_void_p)
INIT_V2 = CFUNCTYPE(c_int, c_size_t, c_size_t, LOGGER, POINTER(c_void_p))
COLL_V4 = CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, c_int, c_void_p, c_int, c_int, c_int, POINTER(c_int))
COLL_V3 = CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, c_int, c_void_p, c_int, c_int, POINTER(c_int))
COLL_V2 = CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, c_int, c_int, c_int, POINTER(c_int), POINTER(c_int), POINTER(c_int))
FINALIZE = CFUNCTYPE(c_int, c_void_p)


class TunerV6(Structure):
    _fields_ = [("name", c_char_p), ("init", INIT_V5), ("getCollInfo", COLL_V4), ("finalize", FINALIZE),
                ("getChunkSize", c_void_p)]


class TunerV5(Structure):
    _fields_ = [("name", c_char_p), ("init", INIT_V5), ("getCollInfo", COLL_V4), ("finalize", FINALIZE)]


class TunerV4(Structure):
    _fields_ = [("name", c_char_p), ("init", INIT_V2), ("getCollInfo", COLL_V4), ("destroy", FINALIZE)]


class TunerV3(Structure):
    _fields_ = [("name", c_char_p), ("init", INIT_V2), ("getCollInfo", COLL_V3), ("destroy", FINALIZE)]


class TunerV2(Structure):
    _fields_ = [("name", c_char_p), ("init", INIT_V2), ("getCollInfo", COLL_V2), ("destroy", FINALIZE)]


STRUCTS = {6: TunerV6, 5: TunerV5, 4: TunerV4, 3: TunerV3, 2: TunerV2}
Table = c_float * 3 * 7


def nccl_table(**ignored) -> Table:
    """A cost table as NCCL fills it for a 2-GPU NVLink all-reduce: Ring and Tree priced (us), CollNet,
    NVLS and PAT ignored; ``ring_ll=True`` etc. marks a cell ignored too."""
    t = Table()
    for a in range(7):
        for p in range(3):
            t[a][p] = 10.0 + 3 * a + p if a in (ALGO["tree"], ALGO["ring"]) else IGNORE
    for cell in ignored:
        algo, proto = cell.rsplit("_", 1)
        t[ALGO[algo]][PROTO[proto]] = IGNORE
    return t


def cells(t: Table) -> list[list[float]]:
    return [list(row) for row in t]


class Comm:
    """One communicator's view of the plugin: init with a recording logger, getCollInfo, finalize."""

    def __init__(self, lib, version: int = 6, nranks: int = 2, nnodes: int = 1, comm_id: int = 0xC0FFEE):
        self.version, self.lines = version, []
        self.logger = LOGGER(self._log)  # kept alive: the plugin stores it in its context
        self.plugin = STRUCTS[version].in_dll(lib, f"ncclTunerPlugin_v{version}")
        self.ctx = c_void_p()
        if version >= 5:
            rc = self.plugin.init(byref(self.ctx), comm_id, nranks, nnodes, self.logger, None, None)
        else:
            rc = self.plugin.init(nranks, nnodes, self.logger, byref(self.ctx))
        assert rc == 0

    def _log(self, level, flags, file, line, fmt, text):
        assert fmt == b"%s"
        self.lines.append((level, flags, text.decode()))

    def coll(self, coll: str, nbytes: int, table: Table | None = None, reg: int = 0, channels: int = 0):
        """Ask as NCCL does; returns (table, nChannels) after the call (v2: (algorithm, protocol, nChannels))."""
        n = c_int(channels)
        if self.version == 2:
            algo, proto = c_int(-1), c_int(-1)
            assert self.plugin.getCollInfo(self.ctx, COLL[coll], nbytes, 0, 0, 1, byref(algo), byref(proto),
                                           byref(n)) == 0
            return algo.value, proto.value, n.value
        table = nccl_table() if table is None else table
        ptr = ctypes.cast(table, c_void_p)
        if self.version == 3:
            rc = self.plugin.getCollInfo(self.ctx, COLL[coll], nbytes, 1, ptr, 7, 3, byref(n))
        else:
            rc = self.plugin.getCollInfo(self.ctx, COLL[coll], nbytes, 1, ptr, 7, 3, reg, byref(n))
        assert rc == 0
        return table, n.value

    def finalize(self):
        fin = self.plugin.finalize if self.version >= 5 else self.plugin.destroy
        assert fin(self.ctx) == 0
        self.ctx = c_void_p()

    def texts(self, level=None) -> list[str]:
        return [t for lv, _, t in self.lines if level is None or lv == level]


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory) -> Path:
    try:
        build.find_compiler()
    except CommdiagError:
        pytest.skip("no C compiler")
    return build.build(tmp_path_factory.mktemp("tuner"), werror=True)  # the source stays warning-free


@pytest.fixture(scope="module")
def lib(lib_path):
    return ctypes.CDLL(str(lib_path))


@pytest.fixture
def rules_file(tmp_path, monkeypatch):
    """Writes TEXT under the header (unless header=False) and points NCCL_TUNER_CONFIG_FILE at it."""
    def make(text: str, header: bool = True) -> Path:
        p = tmp_path / "rules.txt"
        p.write_text(("# commdiag-tuner-rules 1\n" if header else "") + text)
        monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(p))
        return p
    return make


def c_check(lib, path) -> tuple[int, str]:
    """commdiag_tuner_check: the C parser's verdict (canonical rules, or 'error: ...')."""
    buf = ctypes.create_string_buffer(1 << 18)
    f = lib.commdiag_tuner_check
    f.argtypes, f.restype = [c_char_p, c_char_p, c_size_t], c_int
    n = f(os.fsencode(path), buf, len(buf))
    return n, buf.value.decode()


def py_check(path) -> tuple[int, str]:
    try:
        rs = rules.load(path)
    except rules.RulesError as e:
        return -1, f"error: {e.detail}"
    return len(rs), "".join(r.canonical() + "\n" for r in rs)


TWO_GPU = """\
coll=allreduce min_bytes=0 max_bytes=2097152 nranks=2 nnodes=1 algo=ring proto=ll
coll=allreduce min_bytes=2097153 max_bytes=4194304 nranks=2 nnodes=1 algo=ring proto=ll128 channels=8
coll=allreduce min_bytes=0 max_bytes=9223372036854775807 nranks=4 nnodes=1 algo=tree proto=simple
"""


# ---------------------------------------------------------------- build


def test_build_exports_every_abi_newest_first(lib_path, lib):
    assert lib_path.name == "libnccl-tuner-commdiag.so" and lib_path.is_absolute()
    assert build.exported_symbols(lib_path) == build.SYMBOLS
    v6 = TunerV6.in_dll(lib, "ncclTunerPlugin_v6")
    assert v6.name == b"commdiag" and v6.getChunkSize is None  # NULL: NCCL keeps its chunk size


def test_no_compiler_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(CommdiagError, match="no C compiler: 'commdiag-no-such-cc' is not on PATH"):
        build.build(tmp_path, cc="commdiag-no-such-cc")
    monkeypatch.setattr(build, "_as_root", lambda: False)  # $CC is honoured for anyone but root
    monkeypatch.setenv("CC", "commdiag-no-such-cc")
    with pytest.raises(CommdiagError, match="no C compiler: 'commdiag-no-such-cc' is not on PATH"):
        build.build(tmp_path)
    assert not list(tmp_path.iterdir())


def test_cli_build_prints_the_library_and_env_lines(tmp_path, lib_path):
    r = tmp_path / "r.rules"
    rules.write(r, rules.parse_bytes(b"# commdiag-tuner-rules 1\n" + TWO_GPU.encode()))
    out = tmp_path / "out"
    p = run_cli("tuner", "build", "--out", out, "--rules", r, timeout=120)
    assert p.returncode == 0, p.stderr
    lib = out / "libnccl-tuner-commdiag.so"
    assert lib.is_file()
    assert f"  NCCL_TUNER_PLUGIN={lib}\n" in p.stdout and f"  NCCL_TUNER_CONFIG_FILE={r}\n" in p.stdout
    assert "3 rules" in words(p.stdout)
    bad = tmp_path / "bad.rules"
    bad.write_text("# commdiag-tuner-rules 1\ncoll=allreduce algo=ring\n")
    p = run_cli("tuner", "build", "--out", out, "--rules", bad, timeout=120)
    assert p.returncode == 2 and f"{bad}: line 2: missing key 'min_bytes'" in words(p.stderr)


# ---------------------------------------------------------------- matching


def test_rules_match_by_size_range_nranks_and_nnodes(lib, rules_file):
    rules_file(TWO_GPU)
    two = Comm(lib, nranks=2, nnodes=1)
    assert two.texts(INFO)[0].startswith("commdiag-tuner: loaded 3 rules from ")
    assert "2 for nRanks=2 nNodes=1 (comm 0xc0ffee, tuner ABI v6)" in two.texts(INFO)[0]

    for nbytes in (0, 2097152):  # both ends of the range are inside
        t, n = two.coll("allreduce", nbytes)
        want = cells(nccl_table())
        want[ALGO["ring"]][PROTO["ll"]] = 0.0
        assert (cells(t), n) == (want, 0)  # channels=0: NCCL decides
    t, n = two.coll("allreduce", 2097153)
    want = cells(nccl_table())
    want[ALGO["ring"]][PROTO["ll128"]] = 0.0
    assert (cells(t), n) == (want, 8)
    assert two.coll("allreduce", 4194305)[1] == 0 and cells(two.coll("allreduce", 4194305)[0]) == cells(nccl_table())

    four = Comm(lib, nranks=4, nnodes=1)
    t, _ = four.coll("allreduce", 2097152)
    assert t[ALGO["tree"]][PROTO["simple"]] == 0.0 and t[ALGO["ring"]][PROTO["ll"]] > 0
    four_on_two_nodes = Comm(lib, nranks=4, nnodes=2)
    assert cells(four_on_two_nodes.coll("allreduce", 2097152)[0]) == cells(nccl_table())
    for c in (two, four, four_on_two_nodes):
        c.finalize()


def test_unmatched_collective_keeps_nccls_costs_and_channels(lib, rules_file):
    rules_file(TWO_GPU)
    c = Comm(lib)
    before = len(c.lines)
    for coll, nbytes in (("allgather", 1024), ("reducescatter", 1 << 20), ("allreduce", 1 << 30), ("broadcast", 0)):
        t, n = c.coll(coll, nbytes)
        assert cells(t) == cells(nccl_table()) and n == 0  # not 1: the example plugin's trap
    assert len(c.lines) == before  # nothing matched, nothing logged
    c.finalize()
    assert not any("applied" in t for t in c.texts())


def test_first_matching_rule_wins(lib, rules_file):
    rules_file("coll=allreduce min_bytes=0 max_bytes=100 nranks=2 nnodes=1 algo=tree proto=ll\n"
               "coll=allreduce min_bytes=0 max_bytes=1000 nranks=2 nnodes=1 algo=ring proto=simple\n")
    c = Comm(lib)
    assert c.coll("allreduce", 50)[0][ALGO["tree"]][PROTO["ll"]] == 0.0
    t, _ = c.coll("allreduce", 500)
    assert t[ALGO["ring"]][PROTO["simple"]] == 0.0 and t[ALGO["tree"]][PROTO["ll"]] > 0
    c.finalize()


def test_a_disabled_cell_is_left_alone_and_the_reason_logged(lib, rules_file):
    rules_file("coll=allreduce min_bytes=0 max_bytes=4096 nranks=2 nnodes=1 algo=ring proto=ll channels=4\n")
    c = Comm(lib)
    t, n = c.coll("allreduce", 4096, table=nccl_table(ring_ll=True))
    assert cells(t) == cells(nccl_table(ring_ll=True)) and n == 0
    assert any("rule line 2 not applied: allreduce nBytes=4096 regBuff=0: NCCL disabled algo=ring proto=ll" in s
               for s in c.texts(INFO))
    c.finalize()
    assert any("rule line 2 applied 0 times, not applied 1 times" in s for s in c.texts(INFO))


def test_mode_graph_and_eager_follow_ncclss_regbuff_hint(lib, rules_file):
    rules_file("coll=allreduce min_bytes=0 max_bytes=4096 nranks=2 nnodes=1 algo=ring proto=ll128 mode=graph\n"
               "coll=allreduce min_bytes=0 max_bytes=4096 nranks=2 nnodes=1 algo=ring proto=ll mode=eager\n")
    c = Comm(lib, version=5)
    assert c.coll("allreduce", 64, reg=1)[0][ALGO["ring"]][PROTO["ll128"]] == 0.0
    t, _ = c.coll("allreduce", 64, reg=0)
    assert t[ALGO["ring"]][PROTO["ll"]] == 0.0 and t[ALGO["ring"]][PROTO["ll128"]] > 0
    c.finalize()
    v3 = Comm(lib, version=3)  # no regBuff in ABI v3: neither rule can be decided, neither applies
    assert any("2 rules with mode=graph|eager never match: tuner ABI v3 has no regBuff" in s for s in v3.texts(INFO))
    assert cells(v3.coll("allreduce", 64)[0]) == cells(nccl_table())
    v3.finalize()


def test_every_abi_version_applies_the_rules(lib, rules_file):
    rules_file(TWO_GPU)
    for version in (6, 5, 4, 3):
        c = Comm(lib, version=version)
        t, n = c.coll("allreduce", 3 << 20)
        assert t[ALGO["ring"]][PROTO["ll128"]] == 0.0 and n == 8, version
        c.finalize()
    v2 = Comm(lib, version=2)
    # v2 has no cost table: NCCL's adapter may drop the pair silently, so the rule's channels are not set
    assert v2.coll("allreduce", 3 << 20) == (ALGO["ring"], PROTO["ll128"], 0)
    assert v2.coll("allgather", 3 << 20) == (-1, -1, 0)  # unmatched: NCCL decides everything
    v2.finalize()


def test_each_applied_rule_is_logged_once_per_size_then_counted(lib, rules_file, tmp_path):
    path = rules_file(TWO_GPU)
    c = Comm(lib)
    for nbytes in (1024, 1024, 1024, 2048):
        c.coll("allreduce", nbytes)
    applied = [(lv, fl, t) for lv, fl, t in c.lines if "applied:" in t]
    assert [t for _, _, t in applied] == [
        "commdiag-tuner: rule line 2 applied: allreduce nBytes=1024 regBuff=0 -> algo=ring proto=ll channels=0 "
        "(cost was 13.000)",
        "commdiag-tuner: rule line 2 applied: allreduce nBytes=2048 regBuff=0 -> algo=ring proto=ll channels=0 "
        "(cost was 13.000)"]
    # INIT|TUNING: a sweep's init-only log (SUBSYS=ENV,INIT) still shows which rule fired per size
    assert all(lv == INFO and fl == SUBSYS_INIT | SUBSYS_TUNING for lv, fl, _ in applied)
    init_line = c.lines[0]
    assert init_line[:2] == (INFO, SUBSYS_INIT | SUBSYS_TUNING) and str(path) in init_line[2]
    c.finalize()
    assert c.lines[-1] == (INFO, SUBSYS_INIT | SUBSYS_TUNING,
                           "commdiag-tuner: comm 0xc0ffee: rule line 2 applied 4 times, not applied 0 times")
    # A sweep repeats sizes for ever: lines per rule are bounded, the count is not.
    c = Comm(lib)
    for i in range(500):
        c.coll("allreduce", i)
    assert sum("rule line 2 applied:" in t for t in c.texts()) == 64
    assert sum("further applications are counted" in t for t in c.texts()) == 1
    c.finalize()
    assert "rule line 2 applied 500 times" in c.texts()[-1]


@pytest.mark.parametrize("case", ["unset", "missing", "directory", "fifo", "dev-zero", "bad-value", "version",
                                  "no-header", "empty", "too-long-line"])
def test_a_bad_or_missing_file_means_no_rules_and_one_warn(lib, tmp_path, monkeypatch, case):
    target = tmp_path / "rules.txt"
    body = "# commdiag-tuner-rules 1\n" + TWO_GPU
    reason = {"missing": "cannot open: No such file or directory", "directory": "not a regular file",
              "fifo": "not a regular file", "dev-zero": "not a regular file",
              "bad-value": "line 3: proto='LL' (allowed: ll ll128 simple)",
              "version": "line 1: format version '2' not supported",
              "no-header": "line 1: first line must be '# commdiag-tuner-rules 1'",
              "empty": "line 1: first line must be", "too-long-line": "line 2: line longer than 512 bytes",
              "unset": "NCCL_TUNER_CONFIG_FILE is not set"}[case]
    if case == "directory":
        target.mkdir()
    elif case == "fifo":
        os.mkfifo(target)  # nobody writes it: opening must not hang NCCL's init
    elif case == "dev-zero":
        target = Path("/dev/zero")
    elif case == "bad-value":
        target.write_text(body.replace("proto=ll128", "proto=LL"))
    elif case == "version":
        target.write_text(body.replace("rules 1", "rules 2"))
    elif case == "no-header":
        target.write_text(TWO_GPU)
    elif case == "empty":
        target.write_text("")
    elif case == "too-long-line":
        target.write_text("# commdiag-tuner-rules 1\n" + "#" * 513 + "\n" + TWO_GPU)
    if case == "unset":
        monkeypatch.delenv("NCCL_TUNER_CONFIG_FILE", raising=False)
    else:
        monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(target))
    c = Comm(lib)
    warns = [(fl, t) for lv, fl, t in c.lines if lv == WARN]
    assert len(warns) == 1 and len(c.lines) == 1, c.lines
    flags, text = warns[0]
    assert flags == SUBSYS_INIT | SUBSYS_TUNING  # NCCL filters WARN by subsystem too: INIT is on by default
    assert reason in text and text.endswith("; no rules, NCCL chooses every collective"), text
    t, n = c.coll("allreduce", 1024)
    assert cells(t) == cells(nccl_table()) and n == 0
    c.finalize()
    if case not in ("unset", "missing", "directory", "fifo", "dev-zero"):
        with pytest.raises(rules.RulesError) as e:
            rules.load(target)
        assert e.value.detail in text


# ---------------------------------------------------------------- the two parsers


AGREEMENT_CASES = [
    TWO_GPU,
    "\n\n  # indented comment\n\t\ncoll=reduce min_bytes=1 max_bytes=1 nranks=1 nnodes=1 algo=pat proto=simple\n",
    "coll=broadcast\tmin_bytes=0  max_bytes=0 nnodes=1 nranks=8 proto=ll algo=nvls_tree mode=any channels=64\r\n",
    "coll=allreduce min_bytes=0 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll channels=65\n",
    "coll=allreduce min_bytes=-1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=+1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=0x10 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=9223372036854775808 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=00000000000000000001 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=11 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=3 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=0 nnodes=1 algo=ring proto=ll\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll # trailing comment\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll algo=tree\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll speed=fast\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring\n",
    "coll=all=reduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "coll= min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\n",
    "=allreduce\n",
    "coll=sendrecv min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll mode=cuda-graph\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll mode=cuda-graph\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=Ring proto=ll\n",
    "#" * 512 + "\n",
    "#" * 512 + "\r\n",
    "#" * 513 + "\n",
    "# caf\u00e9\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\x00\n",
    "coll=allreduce min_bytes=1 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=ll\rX\n",
    "".join(f"coll=allreduce min_bytes={i} max_bytes={i} nranks=2 nnodes=1 algo=ring proto=ll\n" for i in range(1024)),
    "".join(f"coll=allreduce min_bytes={i} max_bytes={i} nranks=2 nnodes=1 algo=ring proto=ll\n" for i in range(1025)),
]


@pytest.mark.parametrize("i", range(len(AGREEMENT_CASES)))
def test_c_and_python_parsers_agree(lib, tmp_path, i):
    p = tmp_path / "rules.txt"
    p.write_bytes(b"# commdiag-tuner-rules 1\n" + AGREEMENT_CASES[i].encode())
    assert c_check(lib, p) == py_check(p)


def test_header_variants_agree(lib, tmp_path):
    p = tmp_path / "rules.txt"
    for head in (b"", b"\n", b"# commdiag-tuner-rules 1", b"# commdiag-tuner-rules 1\r\n", b"# commdiag-tuner-rules 1 \n",
                 b"# commdiag-tuner-rules 10\n", b"#commdiag-tuner-rules 1\n", b"\xef\xbb\xbf# commdiag-tuner-rules 1\n",
                 b"# commdiag-tuner-rules \n"):
        p.write_bytes(head)
        assert c_check(lib, p) == py_check(p), head


def test_a_file_over_one_mib_is_refused_by_both(lib, tmp_path):
    p = tmp_path / "big.txt"
    p.write_bytes(b"# commdiag-tuner-rules 1\n" + b"#\n" * (1 << 19))
    assert c_check(lib, p) == py_check(p) == (-1, "error: larger than 1048576 bytes")


def _scratch(tmp_path: Path) -> Path:
    """Where thousands of small fuzz files go: tmpfs when there is one (a file write on this overlay disk
    costs ~1-3 ms, 2,300 of them most of this test's time), else tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="commdiag-tuner-", dir=shm))
    return tmp_path


def _fuzz_cases(seed: int) -> list[bytes]:
    """Rules files a mistake or an attacker could produce: mutated good files, random bytes, huge lines,
    many lines, NULs, CRs, numbers at and past every limit."""
    rnd = random.Random(seed)
    head = b"# commdiag-tuner-rules 1\n"
    good = head + TWO_GPU.encode() + b"# end\n"
    words = [b"coll=", b"allreduce", b"min_bytes=", b"max_bytes=", b"nranks=", b"nnodes=", b"algo=", b"proto=",
             b"channels=", b"mode=", b"graph", b"ll128", b"=", b" ", b"\t", b"\n", b"\r", b"\x00", b"#", b"\xff",
             b"9223372036854775807", b"9223372036854775808", b"99999999999999999999", b"-1", b"0", b"64", b"65"]
    cases = [b"", head, head * 3, b"\x00" * 100, head + b"\x00", head + b"\n" * 5000, head + b" " * 600 + b"\n",
             head + b"coll=" + b"a" * 100_000, head + b"x" * 2_000_000,
             head + b"".join(b"coll=allreduce min_bytes=%d max_bytes=%d nranks=2 nnodes=1 algo=ring proto=ll\n"
                             % (i, i) for i in range(3000)),
             head + b"# comment\n" * 90_000]
    for _ in range(1500):
        data = bytearray(good)
        for _ in range(rnd.randint(1, 6)):
            op, at = rnd.randrange(4), rnd.randrange(len(data) + 1)
            if op == 0 and data:
                data[min(at, len(data) - 1)] = rnd.randrange(256)
            elif op == 1:
                data[at:at] = rnd.choice(words)
            elif op == 2:
                del data[at:at + rnd.randint(1, 40)]
            else:
                data[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        cases.append(bytes(data))
    pools = {"coll": rules.COLLS, "algo": rules.ALGOS, "proto": rules.PROTOS, "mode": rules.MODES,
             "min_bytes": ("0", "1", "4096", "2097152"),
             "max_bytes": ("2097152", "2097153", "1073741824", "9223372036854775807"),
             "nranks": ("2", "8", "2147483647"), "nnodes": ("1", "2"), "channels": ("0", "1", "32", "64")}
    for _ in range(400):  # mostly valid rules: the parsers must agree on what they accept, too
        lines = [head.decode().strip()]
        for _ in range(rnd.randint(0, 12)):
            keys = [k for k in rules.KEYS if k in rules.REQUIRED or rnd.random() < 0.5]
            rnd.shuffle(keys)
            if rnd.random() < 0.01:
                keys.pop()
            vals = {k: rnd.choice(pools[k]) if rnd.random() < 0.995 else rnd.choice(("", "x", "-1", "65", "1e3"))
                    for k in keys}
            lines.append(rnd.choice(("", " ", "\t")) + rnd.choice((" ", "  ", "\t")).join(f"{k}={v}"
                                                                                        for k, v in vals.items()))
            if rnd.random() < 0.1:
                lines.append(rnd.choice(("# note", "", "   ")))
        cases.append(("\n".join(lines) + rnd.choice(("\n", "", "\r\n"))).encode())
    for _ in range(200):
        cases.append(bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 3000))))
        cases.append(head + b" ".join(rnd.choice(words) + rnd.choice(words) for _ in range(rnd.randint(1, 30))))
    return cases


def _fuzz_main(lib_path: str, seed: int, work: str) -> None:
    """In a child process: every fuzz case through commdiag_tuner_check and rules.py (must agree), then
    through init/getCollInfo/finalize as NCCL calls them (one WARN iff the file is refused).
    Prints one JSON line: the disagreements."""
    lib = ctypes.CDLL(lib_path)
    path = Path(work) / "fuzz.rules"
    os.environ["NCCL_TUNER_CONFIG_FILE"] = str(path)
    problems = []
    for i, data in enumerate(_fuzz_cases(seed)):
        path.write_bytes(data)
        c, py = c_check(lib, path), py_check(path)
        if c != py:
            problems.append({"case": i, "c": c[1][:200], "py": py[1][:200], "data": data[:200].hex()})
            continue
        comm = Comm(lib, version=6 if i % 2 else 4)
        for coll in ("allreduce", "allgather"):
            for nbytes in (0, 1, 2097152, 2097153, 1 << 40):
                comm.coll(coll, nbytes, reg=nbytes & 1)
        comm.finalize()
        if sum(lv == WARN for lv, _, _ in comm.lines) != (1 if py[0] < 0 else 0):
            problems.append({"case": i, "warns": comm.texts(WARN)})
    print(json.dumps({"cases": i + 1, "problems": problems[:5]}))


def test_fuzzed_rules_files_never_crash_and_both_parsers_agree(lib_path, tmp_path):
    work = _scratch(tmp_path)
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_tuner as t; " \
           f"t._fuzz_main({str(lib_path)!r}, 14, {str(work)!r})"
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           cwd=TESTS.parent)
    finally:
        if work != tmp_path:
            shutil.rmtree(work, ignore_errors=True)
    assert p.returncode == 0, f"the plugin crashed or the child failed (rc {p.returncode}): {p.stderr[-2000:]}"
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["cases"] > 2200 and report["problems"] == []


def _leak_main(lib_path: str, path: str) -> None:
    import resource
    lib = ctypes.CDLL(lib_path)
    os.environ["NCCL_TUNER_CONFIG_FILE"] = path
    rss = []
    for i in range(1000):
        c = Comm(lib)
        c.coll("allreduce", i)
        c.finalize()
        if i in (200, 999):
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print(json.dumps(rss))


def test_finalize_frees_the_context(lib_path, tmp_path):
    # 1000 rules for this communicator: ~100 KB of context per init, 80 MB over the loop if finalize leaked.
    p = tmp_path / "many.rules"
    p.write_text("# commdiag-tuner-rules 1\n" + "".join(
        f"coll=allreduce min_bytes={i} max_bytes={i} nranks=2 nnodes=1 algo=ring proto=ll\n" for i in range(1000)))
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_tuner as t; " \
           f"t._leak_main({str(lib_path)!r}, {str(p)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=TESTS.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    early, late = json.loads(r.stdout.strip().splitlines()[-1])
    assert late - early < 20_000, (early, late)  # KiB


SANITIZER_DRIVER = r"""
#include "commdiag_tuner.c"
static int warns;
static void logger(ct_log_level_t level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[4096]; /* formats the way NCCL's logger does: a bad format or argument shows up here */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  (void)flags; (void)file; (void)line;
  if (level == CT_LOG_WARN) warns++;
}
int main(int argc, char** argv) {
  static char out[1 << 18];
  for (int i = 1; i < argc; i++) {
    setenv("NCCL_TUNER_CONFIG_FILE", argv[i], 1);
    commdiag_tuner_check(argv[i], out, sizeof out);
    commdiag_tuner_check(argv[i], out, 7); /* a short buffer truncates, never overflows */
    for (int v = 2; v <= 6; v += 4) {
      void* ctx = NULL;
      float t[7][3];
      int n = 0, a = -1, p = -1;
      for (int k = 0; k < 21; k++) ((float*)t)[k] = (k % 4 == 0) ? -1.0f : (float)k;
      if (v == 6) ncclTunerPlugin_v6.init(&ctx, 1, 2, 1, logger, NULL, NULL);
      else ncclTunerPlugin_v2.init(2, 1, logger, &ctx);
      for (size_t b = 0; b < 5; b++) {
        size_t nBytes = b == 4 ? (size_t)-1 : b * 2097152;
        if (v == 6) ncclTunerPlugin_v6.getCollInfo(ctx, (int)b, nBytes, 1, (float**)t, 7, 3, (int)(b & 1), &n);
        else ncclTunerPlugin_v2.getCollInfo(ctx, (int)b, nBytes, 0, 0, 1, &a, &p, &n);
      }
      if (v == 6) ncclTunerPlugin_v6.getCollInfo(ctx, 99, 0, 1, (float**)t, 7, 3, 0, &n);
      if (v == 6) ncclTunerPlugin_v6.finalize(ctx);
      else ncclTunerPlugin_v2.destroy(ctx);
    }
  }
  printf("%d files %d warns\n", argc - 1, warns);
  return 0;
}
"""


def test_fuzzed_files_under_address_leak_and_ub_sanitizers(tmp_path):
    """The same fuzz corpus through the plugin compiled with -fsanitize=address,undefined: an out-of-bounds
    read that happens not to crash, undefined behaviour, or a context finalize does not free fails here."""
    cc = build.find_compiler()
    src = tmp_path / "driver.c"
    src.write_text(SANITIZER_DRIVER)
    exe = tmp_path / "driver"
    r = subprocess.run([*cc, "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Wall",
                        "-Wextra", "-Werror", f"-I{build.SOURCE.parent}", "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"this compiler cannot build with sanitizers: {r.stderr[-300:]}")
    corpus = _scratch(tmp_path)
    try:
        files = []
        for i, data in enumerate(_fuzz_cases(41)):
            files.append(corpus / f"{i}.rules")
            files[-1].write_bytes(data)
        files += [Path("/nonexistent/rules"), corpus, Path("/dev/null")]
        env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "halt_on_error=1"}
        r = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True, timeout=300, env=env)
    finally:
        if corpus != tmp_path:
            shutil.rmtree(corpus, ignore_errors=True)
    if "LeakSanitizer has encountered a fatal error" in words(r.stderr):
        pytest.skip("LeakSanitizer cannot run here (ptrace restricted)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith(f"{len(files)} files ")


# ---------------------------------------------------------------- rules.py


def test_rules_render_round_trips_and_refuses_what_the_plugin_would(tmp_path):
    rs = [rules.Rule("allreduce", 0, 2097152, 2, 1, "ring", "ll"),
          rules.Rule("allreduce", 2097153, 4194304, 2, 1, "ring", "ll128", channels=8, mode="graph")]
    path = rules.write(tmp_path / "r.rules", rs, comments=("from reports/run-1, certified",))
    assert path.read_text().splitlines()[:2] == ["# commdiag-tuner-rules 1", "# from reports/run-1, certified"]
    assert rules.load(path) == rs and [r.line for r in rules.load(path)] == [3, 4]
    with pytest.raises(CommdiagError):  # a value that would inject a second rule is not written
        rules.render([rules.Rule("allreduce", 0, 1, 2, 1, "ring\ncoll=allgather", "ll")])
    with pytest.raises(rules.RulesError, match="algo='RING'"):
        rules.render([rules.Rule("allreduce", 0, 1, 2, 1, "RING", "ll")])
    with pytest.raises(CommdiagError, match="only printable ASCII"):
        rules.render(rs, comments=("two\nlines",))
    newer = tmp_path / "newer.rules"
    newer.write_text("# commdiag-tuner-rules 2\n")
    with pytest.raises(rules.RulesError, match=r"newer.rules: line 1: format version '2' not supported .*upgrade"):
        rules.load(newer)
