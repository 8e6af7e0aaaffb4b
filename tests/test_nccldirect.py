"""nccl-direct's ctypes binding: signatures against nccl.h, library discovery, version codes."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from commdiag.measure import nccldirect
from commdiag.errors import SpecError
from commdiag.formats.spec import load_spec

from conftest import write_spec

HEADER = Path(__file__).parent / "fixtures" / "nccl-h" / "nccl.h"

# C type in nccl.h -> the ctypes type the binding must use for it
C_TO_CTYPES = {
    "int*": ctypes.POINTER(ctypes.c_int), "ncclUniqueId*": ctypes.POINTER(nccldirect.NcclUniqueId),
    "ncclComm_t*": ctypes.POINTER(ctypes.c_void_p), "int": ctypes.c_int, "ncclUniqueId": nccldirect.NcclUniqueId,
    "constvoid*": ctypes.c_void_p, "void*": ctypes.c_void_p, "size_t": ctypes.c_size_t,
    "ncclDataType_t": ctypes.c_int, "ncclRedOp_t": ctypes.c_int, "ncclComm_t": ctypes.c_void_p,
    "cudaStream_t": ctypes.c_void_p, "ncclResult_t": ctypes.c_int, "constchar*": ctypes.c_char_p,
}


def header_prototypes(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) for the public (non-p) prototypes in nccl.h."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = {}
    for m in re.finditer(r"(ncclResult_t|const char\s*\*)\s*(nccl\w+)\s*\(([^)]*)\)\s*;", text):
        ret, name, params = m.group(1), m.group(2), m.group(3).strip()
        types = []
        if params and params != "void":
            for p in params.split(","):
                p = p.strip().replace(" *", "* ").replace("*", "* ")
                words = p.split()
                types.append("".join(words[:-1]).replace(" ", ""))  # drop the parameter name
        out[name] = (ret.replace(" ", ""), types)
    return out


@pytest.mark.skipif(not HEADER.exists(), reason="recorded nccl.h not present")
def test_signatures_match_the_recorded_header():
    protos = header_prototypes(HEADER.read_text())
    for name, (restype, argtypes) in nccldirect.SIGNATURES.items():
        assert name in protos, name
        ret, params = protos[name]
        assert C_TO_CTYPES[ret] is restype, (name, ret)
        assert [C_TO_CTYPES[p] for p in params] == argtypes, (name, params)


def test_unique_id_is_128_bytes_passed_by_value():
    assert ctypes.sizeof(nccldirect.NcclUniqueId) == 128
    assert nccldirect.SIGNATURES["ncclCommInitRank"][1][2] is nccldirect.NcclUniqueId


def test_version_codes():
    assert nccldirect.version_string(22809) == "2.28.9"
    assert nccldirect.version_string(2708) == "2.7.8"  # pre-2.9 encoding


def test_loaded_libnccl_reads_process_maps():
    maps = ("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
            "7f10-7f20 r-xp 00000000 08:01 2 /venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2\n")
    assert nccldirect.loaded_libnccl(maps).endswith("nvidia/nccl/lib/libnccl.so.2")
    assert nccldirect.loaded_libnccl("7f00-7f01 r-xp 0 0 0 /usr/lib/libc.so.6\n") is None


def test_vias_default_and_validation(tmp_path):
    spec = load_spec(write_spec(tmp_path / "g.yaml"))
    assert spec.vias == ("torch",)  # gloo: torch only
    with pytest.raises(SpecError, match="gloo allows: torch") as e:
        load_spec(write_spec(tmp_path / "d.yaml", vias=["nccl-direct"]))
    assert e.value.field == "vias[0]"
    nccl = load_spec(write_spec(tmp_path / "n.yaml", backend="nccl", modes=["graph", "eager"]))
    assert nccl.vias == ("torch",) and nccl.replay_stream == "side"  # NCCL: torch by default (docs/fidelity.md)
    both = load_spec(write_spec(tmp_path / "b.yaml", backend="nccl", vias=["torch", "nccl-direct"]))
    assert both.vias == ("torch", "nccl-direct")  # nccl-direct on request
    with pytest.raises(SpecError, match="side, default"):
        load_spec(write_spec(tmp_path / "r.yaml", replay_stream="main"))


def test_auto_batch_fills_the_window_with_an_integer_count():
    from commdiag.measure.worker import MAX_BATCH, _auto_batch

    plan = {"batch": "auto", "window_us": 500}
    assert _auto_batch(plan, 7.0) == 72 and isinstance(_auto_batch(plan, 7.0), int)
    assert _auto_batch(plan, 0.3) == MAX_BATCH  # an empty 1-rank op must not ask for a million calls
    assert _auto_batch(plan, 900.0) == 1
    assert _auto_batch({"batch": 16, "window_us": 500}, 7.0) == 16
