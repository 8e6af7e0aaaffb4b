"""``commdiag explain --log FILE...``: a saved NCCL log of any process, explained; hostile files refused or
shown escaped.  Real 2x H200 logs, constructed SHM/NET logs, and files built here to be hostile."""

from __future__ import annotations

import json
import os
from pathlib import Path

from commdiag.nccl import logread, logreport

from conftest import run_cli, one_message, words

FIX = Path(__file__).parent / "fixtures"
CHECKENV = FIX / "tuner" / "h200x2-gpu-recording-checkenv-ok.log"
H200 = FIX / "h200x2-nvlink" / "nccl-debug-init-env-tuning-defaults.log"
PRE = "nccl-2.28.9-source-strings-not-a-gpu-recording-"


def _lines_fit(text: str) -> None:
    assert all(len(l) <= 100 for l in text.splitlines()), max(text.splitlines(), key=len)


def test_real_server_log_with_tuner_plugin():
    cp = run_cli("explain", "--log", CHECKENV)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert "NCCL version: 2.28.9+cuda13.0" in out
    assert "2 NCCL process(es)" in out and "pid 4720 on vm GPU 0: rank 0/2 nNodes 1" in out
    assert "NCCL_TUNER_PLUGIN=/tmp/gpu/tuner/libnccl-tuner-commdiag.so  (every process)" in out
    assert "  GPU0      -  P2P" in out and "P2P = P2P/CUMEM: 2 pair(s), 24 channel(s) each" in out
    assert "ring 0 1 on channels 0-23" in out
    assert "loaded commdiag (tuner ABI v5) from /tmp/gpu/tuner/libnccl-tuner-commdiag.so" in out
    _lines_fit(out)


def test_one_file_per_rank_and_the_json_envelope(tmp_path):
    # split the real combined log into one file per pid, as NCCL_DEBUG_FILE=nccl.%h.%p.log writes them
    per_pid: dict[str, list[str]] = {}
    for line in H200.read_text().splitlines():
        pid = line.split(":")[1] if line.startswith("vm:") else "other"
        per_pid.setdefault(pid, []).append(line)
    files = []
    for pid, lines in per_pid.items():
        files.append(tmp_path / f"nccl.vm.{pid}.log")
        files[-1].write_text("\n".join(lines) + "\n")
    cp = run_cli("explain", "--json", *[a for f in files for a in ("--log", f)])
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert (data["format"], data["version"]) == ("commdiag-nccl-log", 3)
    assert [p["pid"] for p in data["processes"]] == [662, 663]
    assert [(p["src"], p["dst"], p["cell"]) for p in data["transports"]["pairs"]] == [("0", "1", "P2P"),
                                                                                    ("1", "0", "P2P")]
    assert data["applied"] == {"NCCL_NVLS_ENABLE": {"0": ["vm:662", "vm:663"]}}
    assert {"collective": "AllReduce", "bytes": 14336, "algo": "Ring", "proto": "LL", "channels": 1,
            "calls": 443, "share": 1.0, "other_choices": 0, "processes": ["vm:662"]} in data["tuning"]
    assert data["nodes"] == [{"host": "vm", "processes": [662, 663], "gpus": [0, 1], "ranks": [0, 1],
                              "gpu_names": [], "endpoints": ["0", "1"]}]
    assert len(data["files"]) == 3 and data["notes"] == []


def test_shm_and_net_logs_and_a_partial_log():
    shm = run_cli("explain", "--log", FIX / "transports" / f"{PRE}shm-p2p-disabled.log")
    assert "SHM = SHM/direct/direct: 2 pair(s), 2 channel(s) each" in shm.stdout
    assert "NCCL_P2P_DISABLE=1  (every process)" in shm.stdout
    rank0 = run_cli("explain", "--log", FIX / "h200x2-nvlink" / "explain-tuning-seed-rank0.log")
    assert "  GPU1      .    -" in rank0.stdout
    assert "the log holds 1 of the 2 ranks of a communicator (1 process(es))" in " ".join(rank0.stdout.split())


def test_hostile_log_is_read_bounded_and_printed_escaped(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        f.write(os.urandom(4096).replace(b"\n", b"x") + b"\n")  # binary junk
        f.write(b"h:1:1 [0] NCCL INFO NCCL version 2.28.9\x1b]0;owned\x07+cuda13.0\n")
        f.write(b"h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0\x1b[2J\x1b]0;t\x07\xff\n")
        f.write(b"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\x1b[31m\n")
        f.write(b"h:1:1 [0] NCCL WARN " + b"A" * (logread.MAX_LINE + 10) + b"\n")  # one line over the limit
        f.write(b"\x00\x00 h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0\n")
    cp = run_cli("explain", "--log", log)
    assert cp.returncode == 0, cp.stderr
    assert "\x1b" not in cp.stdout and "\x07" not in cp.stdout and "\x00" not in cp.stdout
    assert "NCCL_SOCKET_IFNAME=eth0\\x1b[2J\\x1b]0;t\\x07" in cp.stdout
    assert "skipped 1 line(s) longer than" in " ".join(cp.stdout.split())
    _lines_fit(cp.stdout)
    data = json.loads(run_cli("explain", "--json", "--log", log).stdout)
    assert data["files"][0]["long_lines_skipped"] == 1
    assert data["transports"]["pairs"][0]["transports"] == {"P2P/CUMEM\x1b[31m": [[0, 0]]}  # JSON escapes it


def test_a_huge_file_stops_at_the_byte_limit(tmp_path):
    log = tmp_path / "big.log"
    line = b"h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}\n"
    log.write_bytes(line * 2000)
    f = logread.read(str(log), max_bytes=len(line) * 100)
    assert f.truncated and f.read_bytes == len(line) * 100 and sum(f.tuning.values()) == 100 and not f.kept
    whole = logread.read(str(log))
    assert not whole.truncated and sum(whole.tuning.values()) == 2000


def test_bad_paths_are_one_clear_error_exit_2(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading must not wait for a writer
    for path, words in [(tmp_path / "missing.log", "no such file"), (tmp_path, "folder"),
                        (fifo, "not a regular file")]:
        cp = run_cli("explain", "--log", path, timeout=60)
        assert cp.returncode == 2 and words in " ".join(cp.stderr.split()) and "Traceback" not in cp.stderr
        assert one_message(cp.stderr)
    cp = run_cli("explain", str(tmp_path), "--log", CHECKENV)
    assert cp.returncode == 2 and "do not give a RUN_DIR" in cp.stderr


def test_a_log_without_nccl_lines_says_what_to_set(tmp_path):
    log = tmp_path / "plain.log"
    log.write_text("INFO: server started\nINFO: ready\n")
    r = logreport.explain_logs([log])
    assert r.processes == [] and "NCCL_DEBUG=INFO" in r.notes[0]


def test_real_one_rank_init_log_with_graph_lines():
    r = logreport.explain_logs([FIX / "transports" / "h200x1-gpu-recording-1rank-init.log"])
    (p,) = r.processes
    assert (p["pid"], p["version"], p["comms"][0]["rank"], p["comms"][0]["nranks"]) == (453, "2.28.9+cuda13.0", 0, 1)
    (comm,) = r.transports["comms"]
    assert comm["rings"] == [{"order": [0], "channels": list(range(64)), "cut": False}]
    assert comm["channels"]["coll"] == 64 and r.transports["pairs"] == []
    assert any("no connection lines" in n for n in r.notes)
    assert r.applied == {"NCCL_NVLS_ENABLE": {"0": ["vm:453"]}}


PREFIXED = [  # (what a launcher or a paste puts before NCCL's record, the rank its tag gives)
    ("(RayWorkerWrapper pid=581, ip=10.225.128.18) ", None), ("(pid=909608) ", None),
    ("(VllmWorker rank=1 pid=4527) ", 1), ("(VllmWorker TP1 pid=4527) ", 1), ("[1,1]<stdout>:", 1),
    ("1: ", 1), ("[default1]:", 1), ("[rank1]:", 1), ("[1] ", 1), ("[2024-10-10 10:00:00 TP1] ", 1),
    ("2024-12-04T05:27:44.080Z ", None), ("  | 2024-12-04T05:27:44.080Z | ", None),
    ("2025-11-12 20:41:43,851 - INFO - ", None), ("> ", None), ("worker-1  | ", None),
]


def test_every_launcher_prefix_is_read_with_the_process_and_its_tag(tmp_path):
    for i, (pre, rank) in enumerate(PREFIXED):
        log = tmp_path / f"p{i}.log"
        log.write_text(f"{pre}box:4527:4527 [1] NCCL INFO NCCL_P2P_DISABLE set by environment to 1\n"
                       f"{pre}box:4527:4527 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/IPC [repeated 3x across "
                       "cluster]\n")
        r = logreport.explain_logs([log])
        assert [(p["host"], p["pid"]) for p in r.processes] == [("box", 4527)], pre
        assert r.applied == {"NCCL_P2P_DISABLE": {"1": ["box:4527"]}}, pre
        assert [(p["src"], p["dst"], list(p["transports"])) for p in r.transports["pairs"]] == [("1", "2", ["P2P/IPC"])]
        assert r.processes[0]["tag_rank"] == rank, pre


def test_stripped_and_redacted_prefixes_and_joined_records_are_still_records(tmp_path):
    log = tmp_path / "pasted.log"
    log.write_text("NCCL INFO Using network Socket\n"
                   "[0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n"
                   "xxxx:xxxx:xxxx [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct "
                   "xxxx:xxxx:xxxx [1] NCCL WARN Cuda failure 'out of memory'\n")
    r = logreport.explain_logs([log])
    assert {(p["src"], p["dst"]) for p in r.transports["pairs"]} == {("0", "1"), ("1", "0")}
    assert [w["text"] for w in r.warnings] == ["Cuda failure 'out of memory'"]
    assert r.network[0]["using"] == "Socket"


def test_shm_on_a_box_whose_topology_shows_nvlink_is_a_cause(tmp_path):
    # the GRAPH pattern line NCCL 2.x prints ("type NVL/PIX"), then SHM between the pair
    log = tmp_path / "nvl.log"
    log.write_text("box:1:1 [0] NCCL INFO Pattern 4, crossNic 0, nChannels 12, bw 20.000000/20.000000, type NVL/PIX, "
                   "sameChannels 1\nbox:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n")
    r = logreport.explain_logs([log])
    assert any("the topology NCCL read shows NVLink, yet GPU pairs use SHM" in c for c in r.causes)
