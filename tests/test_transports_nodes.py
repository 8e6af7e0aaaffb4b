"""Multi-node transport matrices: endpoints keyed r<rank>/GPU<n> stay distinguishable everywhere the
matrix is printed (one letter a cell: column labels), and a diff between a matrix keyed by rank and
one keyed by GPU says it cannot compare them pair by pair.  Lines constructed to the exact form of
the NCCL 2.28.9 recordings in fixtures/transports (comm and Channel lines; host:pid:tid prefix)."""

from __future__ import annotations

from commdiag.nccl import transports as tr


def _line(msg: str, host: str, pid: int, dev: int) -> str:
    return f"{host}:{pid}:{pid} [{dev}] NCCL INFO {msg}"


def two_nodes_of_eight() -> str:
    """16 ranks on two nodes of 8 GPUs: a ring 0..15, P2P within a node, NET/Socket across."""
    lines = []
    for r in range(16):
        host, gpu, pid = f"node{r // 8}", r % 8, 100 + r
        lines.append(_line(f"comm 0x{0x1000 + r:x} rank {r} nRanks 16 nNodes 2 localRanks 8 localRank {gpu} "
                           "MNNVL 0", host, pid, gpu))
        nxt = (r + 1) % 16
        via = "P2P/CUMEM" if nxt // 8 == r // 8 else "NET/Socket/0"
        side = "" if via.startswith("P2P") else " [send]"
        for ch in range(2):
            lines.append(_line(f"Channel {ch:02d}/0 : {r}[{gpu}] -> {nxt}[{nxt % 8}]{side} via {via}", host, pid, gpu))
    return "\n".join(lines)


def test_sixteen_ranks_on_two_nodes_have_distinct_column_labels():
    data = tr.matrix_json(tr.parse(two_nodes_of_eight()).values())
    assert len(data["gpus"]) == 16 and data["gpus"][8] == "r8/GPU0"
    lines = tr.render_matrix(data)
    assert all(len(l) <= 100 for l in lines)
    head = lines[0].split()
    assert head[0] == "from/to" and len(head[1:]) == 16
    assert len(set(head[1:])) == 16, head  # GPU indexes repeat per node: a column label must not
    row7 = lines[1 + 7].split()  # r7/GPU7 sends to r8/GPU0 across the nodes
    assert row7[0] == "r7/GPU7" and row7[1 + 8] == "N"
    assert head[1 + 8] == "8"  # the column of rank 8 says 8, as its row r8/GPU0 does
    assert "  columns are labelled by rank: 8 is the column of r8/GPU0" in lines


def test_a_single_node_matrix_of_one_letter_cells_labels_columns_by_the_whole_gpu_index():
    lines = [_line(f"Channel 00/0 : {r}[{r}] -> {(r + 1) % 16}[{(r + 1) % 16}] via SHM/direct/direct", "box", 10 + r, r)
             for r in range(16)]
    out = tr.render_matrix(tr.matrix_json(tr.parse("\n".join(lines)).values()))
    head = out[0].split()
    assert head[1:] == [str(g) for g in range(16)] and all(len(l) <= 100 for l in out)  # not 0-9 then 0-5
    assert out[1 + 15].split()[:2] == ["GPU15", "S"]


def test_diff_between_rank_keyed_and_gpu_keyed_matrices_does_not_pair_unrelated_endpoints():
    multi = tr.summary_json(tr.parse(two_nodes_of_eight()).values())
    single = tr.summary_json(tr.parse("\n".join(
        _line(f"Channel 00/0 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/CUMEM", "node0", 100 + r, r)
        for r in range(8))).values())
    said = tr.diff(single, multi, "default")
    assert len(said) == 1 and "cannot be compared pair by pair" in said[0], said
    back = tr.diff(multi, single, "default")
    assert len(back) == 1 and "cannot be compared pair by pair" in back[0], back
    assert all(len(l) <= 100 for l in tr.render_configs({"default": {"transports": single},
                                                         "two-nodes": {"transports": multi}}))
