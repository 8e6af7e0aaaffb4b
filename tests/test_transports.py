"""Transport truth: NCCL's connection lines parsed into a GPU x GPU matrix, per config and against default.

Real 2x H200 recordings (P2P/CUMEM over NVLink) and lines constructed to the exact formats in NCCL's
source (tests/fixtures/transports/README.md says which and from where)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commdiag.measure import explain
from commdiag.nccl import transports as tr

FIX = Path(__file__).parent / "fixtures"
H200 = FIX / "h200x2-nvlink" / "nccl-debug-init-env-tuning-defaults.log"
CHECKENV = FIX / "tuner" / "h200x2-gpu-recording-checkenv-ok.log"
CONSTRUCTED = FIX / "transports"
PRE = "nccl-2.28.9-source-strings-not-a-gpu-recording-"


def _summary(path: Path) -> dict:
    return tr.summary_json(tr.parse(path.read_text()).values())


def _line(msg: str, pid: int = 11, dev: int = 0) -> str:
    return f"box:{pid}:{pid} [{dev}] NCCL INFO {msg}"


def test_real_h200_recording_p2p_cumem_both_ways_on_24_channels():
    procs = tr.parse(H200.read_text())
    assert sorted(pid for _, pid in procs) == [662, 663]
    s = _summary(H200)
    cells = {(p["src"], p["dst"]): p for p in s["pairs"]}
    assert set(cells) == {("0", "1"), ("1", "0")}
    for p in cells.values():
        assert p["cell"] == "P2P" and list(p["transports"]) == ["P2P/CUMEM"]
        assert [slot[0] for slot in p["transports"]["P2P/CUMEM"]] == list(range(24))
    (rank0,) = [c for c in s["comms"] if c["rank"] == 0]
    assert rank0["rings"] == [{"order": [0, 1], "channels": list(range(24)), "cut": False}]
    assert rank0["nranks"] == 2 and rank0["nnodes"] == 1 and rank0["nvml_dev"] == 0
    assert {tuple(t["channels"][:2]) for t in rank0["trees"]} == {(0, 1), (6, 7)}
    assert s["connected"] == ["all rings (PXN 0, GDR 1)"]
    assert all(p.version == "2.28.9+cuda13.0" for p in procs.values())


def test_real_check_env_recording_has_the_same_matrix():
    s = _summary(CHECKENV)
    assert [(p["src"], p["dst"], p["cell"]) for p in s["pairs"]] == [("0", "1", "P2P"), ("1", "0", "P2P")]


# Every connection form NCCL 2.18-2.28 prints (src/transport/*.cc), with what the matrix calls it.
FORMS = [
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", "P2P/CUMEM", "P2P", 0, None),
    ("Channel 03/1 : 1[5] -> 0[4] via P2P/CUMEM/read", "P2P/CUMEM/read", "P2P/read", 1, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/CE", "P2P/CUMEM/CE", "P2P/CE", 0, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read/CE", "P2P/CUMEM/read/CE", "P2P/read/CE", 0, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/MNNVL", "P2P/MNNVL", "P2P/MNNVL", 0, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", "P2P/IPC", "P2P", 0, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read", "P2P/IPC/read", "P2P/read", 0, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer", "P2P/direct pointer", "P2P/ptr", 0, None),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read", "P2P/direct pointer/read", "P2P/ptr/read", 0, None),
    ("Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]", "P2P/indirect/1[1]", "P2P>1", 0, None),
    ("Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read", "P2P/indirect/1[1]/read", "P2P>1/read", 0, None),
    ("Channel 07 : 0[0] -> 1[1] via SHM/direct/direct", "SHM/direct/direct", "SHM", None, None),
    ("Channel 07 : 0[0] -> 1[1] via SHM/CE/direct", "SHM/CE/direct", "SHM/CE", None, None),
    ("Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0", "NET/Socket/0", "NET/Socket", 0, "send"),
    ("Channel 00/0 : 0[0] -> 1[1] [receive] via NET/IB/0/GDRDMA", "NET/IB/0/GDRDMA", "NET/IB/GDR", 0, "receive"),
    ("Channel 01/1 : 0[0] -> 1[1] [send] via NET/IB/1(3)/GDRDMA(PCI)/Shared", "NET/IB/1(3)/GDRDMA(PCI)/Shared",
     "NET/IB/GDR", 1, "send"),
    ("Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/Shared", "NET/IB/0/Shared", "NET/IB", 0, "send"),
]


@pytest.mark.parametrize("msg, via, label, conn, side", FORMS)
def test_every_connection_form_in_the_source(msg, via, label, conn, side):
    (proc,) = tr.parse(_line(msg)).values()
    (c,) = proc.connections
    assert (c.via, c.conn_index, c.side) == (via, conn, side)
    assert tr.short_label(c.via) == label
    assert c.kind == via.split("/")[0]


def test_gpu_indexes_come_from_the_brackets_not_the_ranks():
    (proc,) = tr.parse(_line("Channel 03/1 : 1[5] -> 0[4] via P2P/CUMEM/read")).values()
    c = proc.connections[0]
    assert (c.src_rank, c.src_gpu, c.dst_rank, c.dst_gpu) == (1, "5", 0, "4")


def test_nccl_2_18_1_bus_ids_map_to_gpus_through_the_init_lines():
    # 2.18.1 printed busId (%lx) in the brackets, and cudaDev (%x) for P2P/CUMEM (p2p.cc at v2.18.1-1)
    text = "\n".join([
        _line("NCCL version 2.18.1+cuda12.1", 1), _line("NCCL version 2.18.1+cuda12.1", 2, 1),
        _line("comm 0x55aa rank 0 nranks 2 cudaDev 0 busId 3b000 commId 0x1234 - Init COMPLETE", 1),
        _line("comm 0x66bb rank 1 nranks 2 cudaDev 1 busId 5e000 commId 0x1234 - Init COMPLETE", 2, 1),
        _line("Channel 00/0 : 0[3b000] -> 1[5e000] via P2P/IPC", 1),
        _line("Channel 00 : 1[5e000] -> 0[3b000] via SHM/direct/direct", 2, 1),
        _line("Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM", 1),
        _line("Channel 02/0 : 0[3b000] -> 1[af000] via P2P/IPC", 1)])
    conns = [(c.src_gpu, c.dst_gpu) for p in tr.parse(text).values() for c in p.connections]
    assert conns == [("0", "1"), ("0", "1"), ("0", "bus:af000"), ("1", "0")]


def test_ring_lines_in_both_dumpline_styles_and_cut_short():
    text = "\n".join([
        _line("comm 0x5 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0"),
        _line("Channel 00/02 :    0   1   2   3   4   5   6   7            "),  # 2.18: %3d, padded
        _line("Channel 01/02 : 0 7 6 5 4 3 2 1"),
        _line("comm 0x6 rank 0 nRanks 64 nNodes 8 localRanks 8 localRank 0 MNNVL 0"),
        _line("Channel 00/01 :  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 "
              "28 29 30 31 3..."),  # 2.28: cut at 128 characters, "..." written over the last number
    ])
    (proc,) = tr.parse(text).values()
    a, b = proc.comms
    assert a.rings == {0: list(range(8)), 1: [0, 7, 6, 5, 4, 3, 2, 1]} and not a.rings_cut
    assert b.rings[0] == list(range(32)) and b.rings_cut  # the partial "3" is not taken for rank 3
    assert tr.ring_summary(b) == [{"order": list(range(32)), "channels": [0], "cut": True}]


def test_trees_comm_channels_and_connected_lines():
    text = "\n".join([
        _line("comm 0x5 rank 1 nRanks 4 nNodes 1 localRanks 4 localRank 1 MNNVL 0"),
        _line("Trees [0] 2/-1/-1->1->0 [1] 2/-1/-1->1->0 [2] 0/3/-1->1->-1"),
        _line("4 coll channels, 4 collnet channels, 0 nvls channels, 8 p2p channels, 2 p2p channels per peer"),
        _line("Connected all rings"), _line("Connected all trees"),
        _line("Connected all rings, use ring PXN 1 GDR 0"), _line("Connected NVLS tree"),
        _line("rank 1 Connected CollNet"),
        _line("CollNet 00/0 : 1 [send] via COLLNET/SHARP/0/GDRDMA"),
        _line("NVLS multicast support is not available on dev 1 (NVLS_NCHANNELS 16)"),
        _line("P2P is disabled between connected GPUs 1 and 3. You can repress this message with "
              "NCCL_IGNORE_DISABLED_P2P=1."),
    ])
    (proc,) = tr.parse(text).values()
    (comm,) = proc.comms
    assert comm.trees == {0: ([2], 0), 1: ([2], 0), 2: ([0, 3], -1)}
    assert tr.tree_summary(comm) == [{"children": [2], "parent": 0, "channels": [0, 1]},
                                     {"children": [0, 3], "parent": -1, "channels": [2]}]
    assert comm.channels == {"coll": 4, "collnet": 4, "nvls": 0, "p2p": 8, "p2p_per_peer": 2}
    assert proc.connected == ["all rings", "all trees", "all rings (PXN 1, GDR 0)", "NVLS tree", "CollNet"]
    assert len(proc.collnet) == 1 and proc.nvls and proc.p2p_disabled == [(1, 3)]


def test_net_lines_are_counted_once_per_connection():
    s = _summary(CONSTRUCTED / f"{PRE}net-socket-p2p-shm-disabled.log")
    cells = {(p["src"], p["dst"]): p for p in s["pairs"]}
    assert set(cells) == {("0", "1"), ("1", "0")}
    assert cells[("0", "1")]["transports"] == {"NET/Socket/0": [[0, 0], [1, 0]]}  # send and receive: one each


def test_net_receive_line_fills_in_when_the_senders_log_is_missing():
    text = _line("Channel 00/0 : 1[1] -> 0[0] [receive] via NET/IB/0/GDRDMA")
    s = tr.summary_json(tr.parse(text).values())
    assert [(p["src"], p["dst"], p["cell"]) for p in s["pairs"]] == [("1", "0", "NET/IB/GDR")]


def test_mixed_pair_counts_channels_per_transport():
    text = "\n".join([_line(f"Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM") for c in range(20)]
                     + [_line(f"Channel {c:02d} : 0[0] -> 1[1] via SHM/direct/direct") for c in range(20, 24)])
    s = tr.summary_json(tr.parse(text).values())
    (p,) = s["pairs"]
    assert p["cell"] == "P2P20+SHM4"
    lines = tr.render_matrix(s)
    assert any("0->1 mixes transports by channel: P2P/CUMEM on 20, SHM/direct/direct on 4" in l for l in lines)


def test_pcie8_diff_names_the_pairs_that_moved_from_shm_to_p2p():
    default = _summary(CONSTRUCTED / f"{PRE}pcie8-default.log")
    sys_ = _summary(CONSTRUCTED / f"{PRE}pcie8-p2p-level-sys.log")
    assert tr.diff(default, sys_) == ["pairs 1->2, 3->4, 5->6, 7->0 moved from SHM to P2P"]
    assert tr.diff(default, default) == []
    lines = tr.render_configs({"default": {"transports": default, "overrides": {}},
                               "p2p-sys": {"transports": sys_, "overrides": {"NCCL_P2P_LEVEL": "SYS"}},
                               "same": {"transports": default, "overrides": {"NCCL_PROTO": "LL"}}})
    assert "[p2p-sys (NCCL_P2P_LEVEL=SYS)] against default:" in lines
    assert "  pairs 1->2, 3->4, 5->6, 7->0 moved from SHM to P2P" in lines
    assert "[same (NCCL_PROTO=LL)] same transports as default" in lines
    assert all(len(l) <= 100 for l in lines)
    assert "  GPU7    SHM    .    .    .    .    .    .    -" in lines


def test_diff_says_which_pairs_only_one_side_connected():
    a = tr.summary_json(tr.parse(_line("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM")).values())
    b = tr.summary_json(tr.parse(_line("Channel 00 : 1[1] -> 0[0] via SHM/direct/direct")).values())
    assert tr.diff(a, b, "default") == ["pair 0->1: not connected here (P2P in default)",
                                        "pair 1->0: SHM here, not connected in default"]


def test_matrix_fits_100_columns_for_8_and_16_gpus():
    def ring(n, via):
        return "\n".join(_line(f"Channel {c:02d}/0 : {r}[{r}] -> {(r + 1) % n}[{(r + 1) % n}] via {via}", pid=r)
                         for r in range(n) for c in range(2))
    eight = tr.summary_json(tr.parse(ring(8, "P2P/CUMEM/read")).values())
    lines = tr.render_matrix(eight)
    assert all(len(l) <= 100 for l in lines) and lines[0].split()[1:] == [f"GPU{g}" for g in range(8)]
    assert lines[1].split() == ["GPU0", "-", "P2P/read"] + ["."] * 6
    # an 11-character cell on 8 GPUs does not fit whole: one code a cell, never a cut name
    ce = tr.render_matrix(tr.summary_json(tr.parse(ring(8, "P2P/CUMEM/read/CE")).values()))
    assert all(len(l) <= 100 for l in ce) and ce[1].split() == ["GPU0", "-", "P"] + ["."] * 6
    assert "  P = P2P/CUMEM/read/CE: 8 pair(s), 2 channel(s) each" in ce
    sixteen = tr.summary_json(tr.parse(ring(16, "SHM/direct/direct")).values())
    lines = tr.render_matrix(sixteen)
    assert all(len(l) <= 100 for l in lines)
    assert lines[2].split() == ["GPU1", ".", "-", "S"] + ["."] * 13  # one letter a cell past 8 GPUs
    assert "  S = SHM/direct/direct: 16 pair(s), 2 channel(s) each" in lines


def test_no_connection_lines_says_what_to_log():
    lines = tr.render_matrix(tr.summary_json([]))
    assert "NCCL_DEBUG_SUBSYS" in lines[0] and "INIT" in lines[0]


def test_explain_render_shows_the_matrix_beside_the_choices():
    default = _summary(CONSTRUCTED / f"{PRE}pcie8-default.log")
    sys_ = _summary(CONSTRUCTED / f"{PRE}pcie8-p2p-level-sys.log")
    data = {"nccl_version": "2.28.9", "notes": [], "configs": {
        "default": {"status": "ok", "sizes": {"14336": {"algo": "Ring", "proto": "LL", "channels": 2, "calls": 3}},
                    "overrides": {}, "transports": default},
        "p2p-sys": {"status": "ok", "sizes": {"14336": {"algo": "Ring", "proto": "LL", "channels": 2, "calls": 3}},
                    "overrides": {"NCCL_P2P_LEVEL": "SYS"}, "transports": sys_}}}
    text = explain.render(data, [{"bytes": 14336, "tokens": 1}])
    assert "Ring/LL/2" in text and "Transport per GPU pair" in text
    assert "pairs 1->2, 3->4, 5->6, 7->0 moved from SHM to P2P" in text
    # a run explained before transports were recorded renders as before
    old = {"nccl_version": "2.28.9", "notes": [], "configs": {"default": {"status": "ok", "sizes": {}}}}
    assert "Transport" not in explain.render(old, [{"bytes": 14336, "tokens": 1}])


NET1 = CONSTRUCTED / "h200x1-gpu-recording-net-socket-hostid"


def test_real_net_socket_recording_two_nodes_is_keyed_by_rank_and_gpu():
    """Recorded on 1x H200: two ranks on the one GPU, each with an NCCL_HOSTID of its own, so NCCL saw two
    nodes and connected them through sockets (benchmarks/gpu_transports_net1.sh).  GPU indexes repeat
    across nodes: the matrix is rank/GPU x rank/GPU, not one GPU folded onto its diagonal."""
    procs = tr.parse("\n".join(Path(f"{NET1}-rank{r}.log").read_text() for r in (0, 1))).values()
    s = tr.summary_json(procs)
    cells = {(p["src"], p["dst"]): p for p in s["pairs"]}
    assert set(cells) == {("r0/GPU0", "r1/GPU0"), ("r1/GPU0", "r0/GPU0")}
    for p in cells.values():  # each end prints its side: counted once per (channel, connection)
        assert p["cell"] == "NET/Socket" and p["transports"] == {"NET/Socket/0": [[0, 0], [1, 0]]}
    lines = tr.render_matrix(tr.matrix_json(procs))
    assert lines[0].split() == ["from/to", "r0/GPU0", "r1/GPU0"]
    assert lines[1].split() == ["r0/GPU0", "-", "NET/Socket"] and lines[2].split() == ["r1/GPU0", "NET/Socket", "-"]
    assert "row: sending rank/GPU, column: receiving rank/GPU" in "\n".join(lines)


def test_real_net_socket_recording_through_explain_log_with_p2p_and_shm_disabled(tmp_path):
    from conftest import run_cli

    files = [f"{NET1}-p2p-shm-off-rank{r}.log" for r in (0, 1)]
    proc = run_cli("explain", "--log", files[0], "--log", files[1])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "NCCL_P2P_DISABLE=1  (every process)" in out and "NCCL_SHM_DISABLE=1  (every process)" in out
    assert "r0/GPU0           - NET/Socket" in out and "NET/Socket = NET/Socket/0: 2 pair(s), 2 channel(s) each" in out
    assert "rank 0/2 nNodes 2" in out and "NCCL_HOSTID differs between processes" in out


def test_real_duplicate_gpu_refusal_says_why_there_are_no_connections():
    from conftest import run_cli

    proc = run_cli("explain", "--log", CONSTRUCTED / "h200x1-gpu-recording-duplicate-gpu-rank0.log")
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "vm:626: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60" in said
    assert "no connection lines: NCCL warned before it connected anything" in said
    assert "each rank needs a GPU of its own" in said and "NCCL_DEBUG_SUBSYS with INIT" not in said
