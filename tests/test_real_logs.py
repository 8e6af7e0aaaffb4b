"""``explain --log`` on real NCCL logs as users posted them (tests/fixtures/real-logs/, README there: each
file's source thread and hand-read ground truth).  One test per fact that matters: the nodes (hosts, their
processes and ranks), the transport per GPU pair, the version, what NCCL applied and warned, the network,
and what failed.  The reader is pure: every file is read in milliseconds."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from commdiag.nccl import logreport

from conftest import run_cli

REAL = Path(__file__).parent / "fixtures" / "real-logs"
FILES = sorted(p.name for p in REAL.glob("*.log"))


@lru_cache(maxsize=None)
def report(name: str) -> logreport.LogReport:
    return logreport.explain_logs([REAL / name])


@lru_cache(maxsize=None)
def text(name: str) -> str:
    return logreport.render(report(name))


def _f(prefix: str) -> str:
    (name,) = [f for f in FILES if f.startswith(prefix + "-")]
    return name


def test_the_corpus_is_all_here_with_a_readme_row_each():
    readme = (REAL / "README.md").read_text()
    assert len(FILES) >= 36
    for name in FILES:
        assert name[:-4] in readme, name


@pytest.mark.parametrize("name", FILES)
def test_no_log_with_nccl_lines_is_refused_and_every_line_fits(name):
    r = report(name)
    assert "no NCCL lines found" not in " ".join(r.notes)
    assert all(len(line) <= 100 for line in text(name).splitlines())
    assert "rank None" not in text(name) and "/None" not in text(name)


# ----------------------------------------------------------------------------------------------- nodes

NODES = {  # file -> [(host, pids, ranks seen on it)]
    "05": [("nccl-tests", [245], [0, 1])],
    "07": [("node031", [1936469], list(range(8)))],
    "08": [("worker2-us-opwest-1", [182125, 182264, 182265, 182266], [0, 1, 2, 3])],
    "10": [("vllm-0", [936], [])],
    "11": [("aiplatform-wlf2-ge78-70", [102986, 102987], [2, 3]), ("aiplatform-wlf2-ge78-72", [58070, 58071], [0, 1])],
    "18": [("node0", [13571, 13572], [0, 2]), ("node2", [22555, 22556], [1, 3])],
    "22": [("h100clust-worker-1", [497888], [0])],
    "27": [("SH-IDC1-10-198-34-101", [140128, 140129, 140130, 140131], [0, 1, 2, 3]),
           ("SH-IDC1-10-198-34-109", [185882, 185883, 185884, 185885], [4, 5, 6, 7])],
    "30": [("k8s17", [581], [16, 18])],
    "36": [("z-pc", [909608], [0, 1])],
    "41": [("machine-1", [16194], [12, 13, 14, 15])],
    "42": [("ai", [480850, 480851, 480852, 480853], [])],
    "43": [("lassen206", [23224, 23225], [0, 1])],
    "44": [("5873af64cf59", [10158, 10160, 10161], [0, 2, 3])],
    "45": [("server1", [117945, 117948, 117950, 117953], [1, 3, 4, 5, 6, 7]),
           ("server2", [23913, 23917, 23918, 23919, 23920], [8, 9, 11, 12, 13, 14, 15]),
           ("server3", [15216, 15217, 15220, 15221, 15222, 15223], [16, 17, 19, 20, 21, 22, 23]),
           ("server4", [45886, 45888, 45892, 45893], [24, 25, 26, 27, 30, 31])],
    "46": [("<cluster_name>", [919, 921, 923, 924, 926], list(range(8, 16)))],
    "47": [("H20-GPU-05", [1789224, 1789225], [0, 1]), ("H20-GPU-06", [4015540], [3])],
    "48": [("learnfair062", [40503, 40505, 40507, 40509, 40511, 40513, 40515, 40517], list(range(8)))],
    "49": [("3837134f4773", [4527], [1, 2])],
    "50": [("algo-1", [18059, 18064], [1, 2, 6, 7])],
    "51": [("costa-671b-5-worker-1", [382], [0])],
    "52": [("ubuntu", [9621, 39964], [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15])],
    "53": [("node155", [3052668, 3052669, 3052670], [])],
    "54": [("localhost", [11326, 11344], [])],
    "55": [("HOSTNAME", [2753, 4974], [0, 1])],
    "56": [("molgpu01", [2918546], [0, 1])],
    "57": [("DESKTOP-VMBL43V", [4163, 4164], [])],
    "58": [],
    "59": [("user", [852750, 852751, 852753], [])],
    "60": [("g340-cd51-4900-b72a-d104-a9bf-df48", [4181], [0])],
    "61": [("?", [None], [])],
    "62": [("H20-GPU-05", [1789224, 1789225], [0, 1]), ("H20-GPU-06", [4015539, 4015540], [2, 3])],
    "63": [("g1064", [11143, 11144, 11145, 11146], [0, 1, 2, 3]),
           ("g1072", [1263985, 1263986, 1263987, 1263988], [4, 5, 6, 7])],
    "64": [("?", [None], [5]), ("VM-17-82-centos", [11978, 11979, 11980, 11981, 11982, 11984, 11985],
                                [0, 1, 2, 3, 4, 6, 7])],
    "65": [("ip-10-216-178-255", [416483], [20, 21]), ("ip-10-216-179-119", [416602, 416603], [24, 25, 26]),
           ("ip-10-216-179-193", [641219], [0, 1]), ("ip-10-216-179-87", [417137], [13, 14])],
    "66": [("hostname-test", [980, 981, 983, 984, 985], [32, 33, 35, 36, 37])],
    "67": [("10-90-43-152", [120890], [0, 1, 2, 3])],
    "68": [("sh9-machine-20250813085604-64df4c99dc-m27xf", [3884994], list(range(8)))],
    "69": [("H20-GPU-05", [1789225], [0, 1]), ("H20-GPU-06", [4015539, 4015540], [2, 3])],
    "70": [("job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0", [5665, 5668, 5669, 5670], [0, 1, 2, 4, 5, 6, 7])],
    "71": [("ip-172-31-44-237", [52617], [1, 3, 4, 5, 7])],
    "72": [("ip-172-31-0-11", [45384], [0]), ("ip-172-31-0-8", [45357], [60]), ("ip-172-31-1-93", [45294], [52]),
           ("ip-172-31-10-82", [45236], [30]), ("ip-172-31-10-85", [45355], [28]), ("ip-172-31-10-87", [45316], [24]),
           ("ip-172-31-11-92", [45293], [34]), ("ip-172-31-13-243", [45551], [42]),
           ("ip-172-31-14-180", [45375], [25]), ("ip-172-31-2-97", [45537], [21]), ("ip-172-31-4-37", [45379], [33]),
           ("ip-172-31-5-166", [45528], [32]), ("ip-172-31-6-136", [45332], [17]), ("ip-172-31-6-84", [45321], [22]),
           ("ip-172-31-8-153", [45343], [62]), ("ip-172-31-8-187", [46118], [29])],
    "73": [("73e9f9f45158", [6241, 6242, 6243], [0, 1, 2, 3])],
    "74": [("vllm-0", [539], [6])],
    "75": [("deepseek-v2-5-0", [641], [0, 7])],
    "76": [("crow-ib-new-nccl-256-info-19", [5330], [153, 154, 155, 157])],
}


def test_every_file_has_its_nodes_fact():
    assert sorted(NODES) == sorted(f.split("-")[0] for f in FILES)


@pytest.mark.parametrize("key", sorted(NODES))
def test_nodes_are_the_hosts_of_the_prefixes(key):
    r = report(_f(key))
    assert [(n["host"], n["processes"], n["ranks"]) for n in r.nodes] == NODES[key]


def test_one_process_driving_several_gpus_is_one_process_with_a_rank_per_gpu():
    (p,) = report(_f("07")).processes
    assert p["devices"] == list(range(8)) and [g["ranks"] for g in p["ranks"]] == [[r] for r in range(8)]
    assert "one process, 8 GPUs" in text(_f("07")) and "give every rank's file" not in text(_f("07"))
    assert not any("ranks of a communicator" in n for n in report(_f("07")).notes)
    (p,) = report(_f("05")).processes
    assert p["devices"] == [0, 1] and p["nvml"] == {0: 2, 1: 3}  # "Setting affinity for GPU 2/3"
    assert "GPU 0, 1 (nvidia-smi GPU 2, 3) (one process, 2 GPUs)" in " ".join(text(_f("05")).split())


def test_launcher_tags_give_the_rank_only_where_nccl_does_not():
    ps = {p["pid"]: p for p in report(_f("11")).processes}
    assert ps[58070]["ranks"] == [{"device": 0, "ranks": [0], "from": "the launcher's tag"}]
    assert ps[102987]["ranks"] == [{"device": 1, "ranks": [3], "from": "NCCL"}]  # its Trees line says 3
    assert ps[58070]["tag_rank"] == 0 and "rank 0 (tag)" in text(_f("11"))


def test_nccl_tests_device_lines_name_the_gpus_and_their_processes():
    r = report(_f("62"))
    assert [n["gpu_names"] for n in r.nodes] == [["NVIDIA H20-3e"], ["NVIDIA H20-3e"]]
    assert {p["pid"]: p["devices"] for p in r.processes} == {1789224: [0], 1789225: [1], 4015539: [0], 4015540: [1]}
    assert r.multi_node


def test_the_network_inside_one_box_is_not_taken_for_another_node():
    r = report(_f("67"))  # one process, 4 GPUs, NET/IB between them: still one node, keyed by GPU
    assert not r.multi_node and r.transports["gpus"] == ["0", "1", "2", "3"]
    eps = report(_f("69")).transports["endpoints"]
    assert (eps["r0/GPU0"]["host"], eps["r2/GPU0"]["host"]) == ("H20-GPU-05", "H20-GPU-06")


def test_a_host_name_cut_in_the_paste_is_the_same_process():
    (node,) = report(_f("75")).nodes
    assert node["host"] == "deepseek-v2-5-0" and node["processes"] == [641]


def test_more_nodes_than_host_names_is_said_and_keyed_by_rank():
    for key in ("41", "46", "52", "66"):
        r = report(_f(key))
        assert r.multi_node and r.more_nodes, key
        assert any("more nodes than the log's host names" in n for n in r.notes), key


# ----------------------------------------------------------------------------------------- transports

PAIRS = {  # file -> {(src, dst): cell}
    "05": {("0", "1"): "SHM"},
    "07": {(str(r), str((r + 1) % 8)): "SHM" for r in range(8)},
    "08": {("0", "1"): "P2P", ("1", "2"): "P2P", ("2", "3"): "P2P", ("3", "2"): "P2P"},
    "18": {("r0/GPU0", "r1/GPU0"): "NET/Socket", ("r1/GPU0", "r0/GPU0"): "NET/Socket",
           ("r2/GPU1", "r1/GPU0"): "NET/Socket", ("r2/GPU1", "r0/GPU0"): "SHM"},
    "27": {("r5/GPU1", "r0/GPU0"): "NET/IB/GDR", ("r1/GPU1", "r4/GPU0"): "NET/IB/GDR",
           ("r6/GPU2", "r5/GPU1"): "P2P/read", ("r2/GPU2", "r1/GPU1"): "P2P/read"},
    "30": {("bus:17000", "bus:21000"): "P2P"},
    "36": {("bus:2d000", "bus:2e000"): "P2P(failed)"},
    "41": {("r15/bus:b2000", "r13/bus:89000"): "P2P/ptr", ("r13/bus:89000", "r12/bus:88000"): "P2P/ptr",
           ("r6/bus:b1000", "r14/bus:b1000"): "NET/IB/GDR"},
    "45": {(f"r{a}/GPU{a % 8}", f"r{b}/GPU{b % 8}"): "P2P" for a, b in
           [(26, 24), (23, 19), (17, 21), (8, 9), (31, 27), (7, 3), (22, 23), (21, 20), (30, 31), (12, 14),
            (16, 17), (1, 5), (20, 22), (14, 15), (6, 7), (13, 12), (15, 11), (4, 6), (24, 25)]},
    "46": {("r8/GPU0", "r15/GPU7"): "P2P/read", ("r10/GPU2", "r9/GPU1"): "P2P/read",
           ("r12/GPU4", "r11/GPU3"): "P2P/read", ("r13/GPU5", "r12/GPU4"): "P2P/read",
           ("r15/GPU7", "r14/GPU6"): "P2P/read", ("r15/GPU7", "r6/GPU6"): "NET/Socket"},
    "48": {(str(a), str(b)): "P2P" for a, b in [(3, 2), (4, 6), (5, 7), (6, 5), (7, 3), (1, 0), (2, 1), (2, 3),
                                                 (1, 2), (0, 4), (3, 0), (4, 7), (5, 1), (7, 6), (0, 1)]},
    "49": {("1", "2"): "P2P"},
    "50": {("7", "6"): "P2P/read", ("2", "1"): "P2P/read"},
    "52": {**{(f"r{r}/GPU{r}", f"r{r + 1}/GPU{r + 1}"): "SHM" for r in range(1, 7)},
           **{(f"r{r}/GPU{r - 8}", f"r{r + 1}/GPU{r - 7}"): "SHM" for r in range(9, 15)}},
    "55": {("r0/GPU0", "r1/GPU0"): "P2P(failed)", ("r1/GPU0", "r0/GPU0"): "P2P"},
    "56": {("bus:21000", "bus:1000"): "P2P"},
    "63": {("r1/GPU1", "r4/GPU0"): "NET/Socket", ("r3/GPU3", "r6/GPU2"): "NET/Socket",
           ("r7/GPU3", "r5/GPU1"): "P2P", ("r2/GPU2", "r0/GPU0"): "P2P", ("r2/GPU2", "r3/GPU3"): "P2P"},
    "64": {**{(f"r{a}/GPU{a % 8}", f"r{b}/GPU{b % 8}"): "NET/IBext/GDR" for a, b in
              [(2, 10), (1, 9), (3, 11), (8, 0), (15, 7), (12, 4), (14, 6), (13, 5)]}},
    "65": {("r25/bus:101d0", "r24/bus:101c0"): "P2P/read", ("r26/bus:201c0", "r25/bus:101d0"): "P2P/read",
           ("r14/bus:a01c0", "r13/bus:901d0"): "P2P/read", ("r21/bus:901d0", "r20/bus:901c0"): "P2P/read",
           ("r0/bus:101c0", "r1/bus:101d0"): "P2P/read"},
    "66": {(f"r{a}/GPU{a % 16}", f"r{b}/GPU{b % 16}"): "NET/IBext_v8" for a, b in
           [(36, 20), (32, 0), (51, 35), (37, 5), (49, 33)]},
    "67": {(str(a), str(b)): "NET/IB/GDR" for a, b in [(0, 1), (0, 2), (2, 0), (2, 1), (2, 3), (3, 0), (3, 2)]},
    "68": {(str(a), str(a + 1)): "P2P/ptr" for a in (0, 1, 2, 3, 4, 6)},
    "69": {("r0/GPU0", "r2/GPU0"): "NET/IB/GDR", ("r1/GPU1", "r3/GPU1"): "NET/IB/GDR",
           ("r3/GPU1", "r1/GPU1"): "NET/IB/GDR", ("r3/GPU1", "r2/GPU0"): "P2P", ("r1/GPU1", "r0/GPU0"): "P2P"},
    "70": {("7", "0"): "P2P", ("6", "5"): "P2P", ("2", "1"): "P2P", ("5", "4"): "P2P"},
    "71": {("r4/GPU4", "r5/GPU5"): "P2P", ("r4/GPU4", "r7/GPU7"): "P2P", ("r4/GPU4", "r3/GPU3"): "SHM",
           ("r4/GPU4", "r1/GPU1"): "SHM(failed)", ("r4/GPU4", "r19"): "NET/Socket", ("r19", "r4/GPU4"): "NET/Socket"},
    "72": {("r34/GPU0", "r33/GPU0"): "NET/Socket", ("r22/GPU0", "r21/GPU0"): "NET/Socket",
           ("r30/GPU0", "r29/GPU0"): "NET/Socket", ("r16", "r24/GPU0"): "NET/Socket",
           ("r24/GPU0", "r28/GPU0"): "NET/Socket", ("r0/GPU0", "r32/GPU0"): "NET/Socket",
           ("r56", "r52/GPU0"): "NET/Socket", ("r42/GPU0", "r41"): "NET/Socket", ("r62/GPU0", "r61"): "NET/Socket",
           ("r56", "r60/GPU0"): "NET/Socket"},
    "73": {("bus:b0", "bus:80"): "SHM", ("bus:90", "bus:c0"): "SHM"},
    "75": {("r0/GPU0", "r7/GPU7"): "P2P/read", ("r0/GPU0", "r9/GPU1"): "NET/IB/GDR"},
    "76": {("bus:3d000", "bus:b2000"): "P2P", ("bus:3d000", "bus:1b000"): "P2P", ("bus:3d000", "bus:3e000"): "P2P"},
}


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_transport_per_pair(key):
    got = {(p["src"], p["dst"]): p["cell"] for p in report(_f(key)).transports["pairs"]}
    assert got == PAIRS[key]


@pytest.mark.parametrize("key", sorted(set(NODES) - set(PAIRS)))
def test_logs_without_connection_lines_have_no_pairs(key):
    assert report(_f(key)).transports["pairs"] == []


def test_a_cross_node_pair_never_folds_onto_an_in_box_one():
    # 18: rank 0 and rank 1 are both GPU 0, on two nodes; 27: 5->0 and 1->4 are two different cross-node pairs
    eps = report(_f("18")).transports["endpoints"]
    assert (eps["r0/GPU0"]["host"], eps["r1/GPU0"]["host"], eps["r2/GPU1"]["host"]) == ("node0", "node2", "node0")
    eps = report(_f("27")).transports["endpoints"]
    assert {k: v["host"][-3:] for k, v in eps.items()} == {"r0/GPU0": "101", "r1/GPU1": "101", "r2/GPU2": "101",
                                                           "r4/GPU0": "109", "r5/GPU1": "109", "r6/GPU2": "109"}
    # 41: one host in the file, yet rank 6 and rank 14 (both bus b1000) are two GPUs: never the diagonal
    assert ("r6/bus:b1000", "r14/bus:b1000") in {(p["src"], p["dst"]) for p in report(_f("41")).transports["pairs"]}


def test_bus_ids_map_to_gpus_only_where_every_one_of_the_host_maps():
    assert report(_f("08")).transports["gpus"] == ["0", "1", "2", "3"]  # each sender's [dev] names its bus id
    assert report(_f("05")).transports["gpus"] == ["0", "1"]  # c2000 = rank 1's GPU 1 (its Trees line)
    assert report(_f("30")).transports["gpus"] == ["bus:17000", "bus:21000"]  # 21000 is no process of the log


def test_a_connection_whose_setup_failed_is_not_drawn_as_working():
    r = report(_f("36"))
    assert r.failed == [{"src": "bus:2d000", "dst": "bus:2e000", "via": "P2P/IPC", "warn": "failed to open CUDA IPC "
                         "handle : 217 peer access is not supported between these two devices"}]
    said = " ".join(text(_f("36")).split())
    assert "217 peer access is not supported between these two devices" in said  # the WARN whole, not cut at 80
    assert "NCCL_P2P_DISABLE=1" in said and "setup FAILED" in said
    assert report(_f("55")).failed[0]["warn"] == "failed to open CUDA IPC handle : 11 invalid argument"
    assert report(_f("71")).failed == [{"src": "r4/GPU4", "dst": "r1/GPU1", "via": "direct shared memory",
                                        "warn": "Cuda failure 'invalid argument'"}]


def test_p2p_disabled_lines_are_reported_per_process():
    (d,) = report(_f("10")).p2p_disabled
    assert (d["id"], d["pairs"], d["lines"]) == ("vllm-0:936", [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)], 9)
    assert "NCCL found no P2P between GPU pair(s) 0-1, 0-2, 0-3, 1-3, 2-3" in " ".join(text(_f("10")).split())
    got = {d["pid"]: d["pairs"] for d in report(_f("53")).p2p_disabled}
    assert got == {3052668: [(0, 1), (1, 2)], 3052669: [(0, 1), (0, 2), (1, 2)], 3052670: [(0, 1), (0, 2)]}


def test_joined_and_broken_records_are_split_and_rejoined():
    r = report(_f("48"))
    by_pid = {p["pid"]: p["devices"] for p in r.processes}
    assert by_pid[40515] == [6] and by_pid[40505] == [1]
    assert sum(len(s) for p in r.transports["pairs"] for s in p["transports"].values()) == 17
    r = report(_f("64"))  # "... [receive] via" at a line's end, "NET/IBext/4/GDRDMA" on the next
    assert ("r12/GPU4", "r4/GPU4") in {(p["src"], p["dst"]) for p in r.transports["pairs"]}
    assert not r.unknown


def test_rccl_suffix_is_not_part_of_the_transport_name():
    vias = {v for p in report(_f("63")).transports["pairs"] for v in p["transports"]}
    assert vias == {"NET/Socket/1", "NET/Socket/2", "P2P/IPC"}
    assert "comm 0x" not in "".join(report(_f("30")).transports["pairs"][0]["transports"])
    ranks = {p["pid"]: [x for g in p["ranks"] for x in g["ranks"]] for p in report(_f("63")).processes}
    assert ranks == {11143: [0], 11144: [1], 11145: [2], 11146: [3], 1263985: [4], 1263986: [5], 1263987: [6],
                     1263988: [7]}  # 11143 and 1263986 only said "Connected all rings comm ... busId": their GPU's rank
    assert "rank ?/" not in text(_f("63")) and "pid 11144 on g1064 GPU 1: rank 1/8" in text(_f("63"))


# ------------------------------------------------------------------------------------------- versions

VERSIONS = {"05": "2.8.2+cuda11.1", "36": "2.7.8", "42": "2.10.3+cuda11.3", "43": "2.10.3+cuda10.2",
            "44": "2.5.6+cuda10.2", "54": "2.25.1+cuda12.2", "57": "2.18.5+cuda12.1"}


@pytest.mark.parametrize("key", sorted(VERSIONS))
def test_version_from_its_line_whatever_its_form(key):
    assert report(_f(key)).version["versions"] == [VERSIONS[key]]
    assert f"NCCL version: {VERSIONS[key]}" in " ".join(text(_f(key)).split())


def test_a_log_of_a_version_line_only_is_read_not_refused():
    r = report(_f("58"))
    assert r.version["found_outside_nccl_lines"][0]["version"] == "2.20.5+cuda12.4"
    assert "NCCL version: 2.20.5+cuda12.4" in " ".join(text(_f("58")).split())
    assert "no NCCL INFO/WARN line" in r.notes[0]


HINTS = {"08": "NCCL < 2.18.3", "18": "NCCL >= 2.17", "22": "NCCL 2.19-2.23", "07": "NCCL >= 2.19", "73": "NCCL 2.5 (", "45": "NCCL <= 2.5",
         "48": "NCCL <= 2.5", "55": "NCCL <= 2.5", "56": "NCCL 2.5-2.7"}


@pytest.mark.parametrize("key", sorted(HINTS))
def test_a_log_without_a_version_line_says_what_its_forms_show(key):
    assert HINTS[key] in report(_f(key)).version["hint"]
    assert "NCCL version: not in the log; its forms say" in " ".join(text(_f(key)).split())


def test_older_forms_are_named_never_skipped_silently():
    assert "'via direct shared memory' (NCCL <= 2.8's word for SHM)" in report(_f("05")).version["forms"]
    assert any("NCCL 2.5-2.7" in f for f in report(_f("36")).version["forms"])
    assert any("'Ring NN : 0 1 2 ...'" in f for f in report(_f("55")).version["forms"])
    for name in FILES:  # 74's last line was cut by Ray's deduplication: named as unknown, never dropped
        assert report(name).unknown == ([] if not name.startswith("74-") else ["Channel 00/0 : 6["]), name
    assert any("a form this reader does not know" in n for n in report(_f("74")).notes)


def test_an_unknown_form_is_named(tmp_path):
    log = tmp_path / "odd.log"
    log.write_text("h:1:1 [0] NCCL INFO Channel 00 : 0[0] => 1[1] via P2P/IPC\n")
    r = logreport.explain_logs([log])
    assert r.unknown == ["Channel 00 : 0[0] => 1[1] via P2P/IPC"]
    assert any("a form this reader does not know" in n for n in r.notes)


# ------------------------------------------------------------------------------- applied, warned, causes

APPLIED = {
    "05": {"NCCL_P2P_LEVEL": {"LOC": ["nccl-tests:245"]}},
    "30": {"NCCL_MIN_P2P_NCHANNELS": {"16": ["k8s17:581"]}, "NCCL_NCHANNELS_PER_PEER": {"16": ["k8s17:581"]}},
    "51": {"NCCL_TOPO_FILE": {"/proc/self/fd/156": ["costa-671b-5-worker-1:382"]}},
    "59": {"NCCL_IB_DISABLE": {"1": ["user:852750", "user:852751", "user:852753"]}},
    "74": {"NCCL_P2P_LEVEL": {"NVL": ["vllm-0:539"]}, "NCCL_CUMEM_ENABLE": {"0": ["vllm-0:539"]}},
}


@pytest.mark.parametrize("key", sorted(NODES))
def test_applied_settings_keyed_by_host_and_pid(key):
    assert report(_f(key)).applied == APPLIED.get(key, {})


def test_no_variable_set_is_not_a_request_for_env_logging():
    for key in ("07", "27", "42"):
        assert "NCCL_DEBUG_SUBSYS" not in " ".join(report(_f(key)).notes)


def test_settings_of_two_hosts_that_share_a_pid_are_kept_apart(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("nodeA:7:7 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1\n")
    b.write_text("nodeB:7:7 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 0\n")
    r = logreport.explain_logs([a, b])
    assert r.applied == {"NCCL_P2P_DISABLE": {"1": ["nodeA:7"], "0": ["nodeB:7"]}}
    assert any("NCCL_P2P_DISABLE differs between processes" in n for n in r.notes)


WARNS = {"36": [("z-pc:909608", False)], "42": [("ai:480850", True), ("ai:480851", True), ("ai:480852", True)],
         "55": [("HOSTNAME:2753", False), ("HOSTNAME:4974", False)],
         "57": [("DESKTOP-VMBL43V:4163", False), ("DESKTOP-VMBL43V:4164", False)],
         "71": [("ip-172-31-44-237:52617", False)]}


@pytest.mark.parametrize("key", sorted(NODES))
def test_warnings_per_process_with_benign_ones_marked(key):
    assert [(w["id"], w["benign"]) for w in report(_f(key)).warnings] == WARNS.get(key, [])


def test_a_benign_libibverbs_warn_is_never_the_cause():
    r = report(_f("42"))
    assert not any("libibverbs" in c for c in r.causes)
    assert "(benign: NCCL looks for it on every start)" in text(_f("42"))
    assert "Failed to find CUDA library libcuda.so" in report(_f("57")).causes[0]


NETWORK = {"05": "Socket", "42": "Socket", "43": "IB", "54": "Socket", "56": "Socket", "59": "Socket"}


@pytest.mark.parametrize("key", sorted(NETWORK))
def test_the_network_nccl_chose(key):
    assert {n["using"] for n in report(_f(key)).network} == {NETWORK[key]}
    assert f"Using network {NETWORK[key]}" in " ".join(text(_f(key)).split())


def test_no_ib_device_and_sockets_between_nodes_are_the_cause():
    assert any("NET/IB : No device found." in line for n in report(_f("44")).network for line in n["lines"])
    (cause,) = [c for c in report(_f("18")).causes if "TCP sockets" in c]
    assert "traffic between nodes goes over TCP sockets (NET/Socket)" in cause
    assert any("TCP sockets" in c for c in report(_f("63")).causes)


def test_shm_cause_names_the_setting_that_turned_p2p_off():
    said = " ".join(" ".join(report(_f("05")).causes).split())
    assert "because P2P was turned off: NCCL_P2P_LEVEL=LOC in nccl-tests:245" in said
    assert any("none by P2P" in c for c in report(_f("07")).causes)


def test_numeric_tuning_lines_are_mapped():
    (t,) = report(_f("22")).tuning
    assert (t["collective"], t["bytes"], t["algo"], t["proto"], t["calls"]) == ("?", 8, "Tree", "LL", 15)
    assert "(unnamed): NCCL ~2.19-2.23 printed no collective name" in " ".join(text(_f("22")).split())


# ---------------------------------------------------------------------------------------- output order

def test_text_leads_with_nodes_then_pairs_then_settings_warnings_and_cause():
    out = text(_f("36"))
    at = [out.index(s) for s in ("Nodes and GPUs", "Transport per GPU pair", "NCCL_* values", "NCCL WARN lines",
                                 "What the log shows")]
    assert at == sorted(at)


def test_one_file_per_node_after_one_log_option_and_the_json_nodes(tmp_path):
    # 18 as two files, one per node (the lines of each host, launcher tags kept): the shell's --log logs/*.log
    lines = (REAL / _f("18")).read_text().splitlines()
    for host in ("node0", "node2"):
        (tmp_path / f"{host}.log").write_text("\n".join(l for l in lines if f" {host}:" in l) + "\n")
    cp = run_cli("explain", "--json", "--log", tmp_path / "node0.log", tmp_path / "node2.log")
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert (data["format"], data["version"]) == ("commdiag-nccl-log", 3)
    assert len(data["files"]) == 2 and [n["host"] for n in data["nodes"]] == ["node0", "node2"]
    assert data["nodes"][0] == {"host": "node0", "processes": [13571, 13572], "gpus": [0, 1], "ranks": [0, 2],
                                "gpu_names": [], "endpoints": ["r0/GPU0", "r2/GPU1"]}
    whole = report(_f("18")).transports
    assert [(p["src"], p["dst"], p["cell"]) for p in data["transports"]["pairs"]] == \
        [(p["src"], p["dst"], p["cell"]) for p in whole["pairs"]]
    cp = run_cli("explain", "--log", tmp_path / "node0.log", str(tmp_path))
    assert cp.returncode == 2 and "--log DIR/*.log" in " ".join(cp.stderr.split())


def test_two_jobs_in_one_call_never_fold_their_rank_0s():
    r = logreport.explain_logs([REAL / _f("18"), REAL / _f("27")])
    eps = r.transports["endpoints"]
    assert eps["r0/GPU0@node0"]["host"] == "node0" and eps["r0/GPU0@SH-IDC1-10-198-34-101"]["host"].endswith("101")
