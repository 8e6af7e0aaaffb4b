"""Which transport NCCL connected each pair of GPUs with, per channel, from its own INFO lines.

NCCL prints one line per connection it sets up (subsystem INIT, also P2P/SHM/NET).  The forms,
read in NVIDIA/nccl at tags v2.18.1-1 .. v2.28.9-1 (``src/transport/{p2p,shm,net,coll_net}.cc``)::

    Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM                 p2p.cc, cuMem (NCCL_CUMEM_ENABLE)
    Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM/read            /read: P2P read (NVLink default)
    Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/CE              /CE: copy engine (NCCL_P2P_USE_CUDA_MEMCPY)
    Channel 00/0 : 0[0] -> 1[1] via P2P/MNNVL                 2.20+: multi-node NVLink
    Channel 00/0 : 0[0] -> 1[1] via P2P/IPC[/read][/CE]       legacy CUDA IPC (cuMem off)
    Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer[/read] both GPUs in one process
    Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1][/read]  through an intermediate GPU
    Channel 00 : 0[0] -> 1[1] via SHM/direct/direct           shm.cc: host memory; CE on either side
    Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0       net.cc: printed by the sender ...
    Channel 00/0 : 0[0] -> 1[1] [receive] via NET/IB/0/GDRDMA ... and again by the receiver
    Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0(2)/GDRDMA(PCI)/Shared   (N): PXN proxy rank;
                                                              (PCI): 2.26+ GDR over PCI; /Shared buffers
    CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA        coll_net.cc: not a GPU pair

``CH/CONN``: channel and connection index (0 for rings/trees; 1 for the second connection of a
pair, used by P2P operations and CollNet).  The bracket is the GPU's NVML index (``nvmlDev``) since
2.18.3; in 2.18.1 it was the PCI bus id in hex (``%lx``), and for P2P/CUMEM the CUDA device in hex.
P2P and SHM lines are printed only by the sender; NET lines by both ends.

Around them, per communicator (``src/init.cc``, ``src/graph/rings.cc``, ``src/transport/generic.cc``):
``comm 0x.. rank R nRanks N nNodes K localRanks L localRank l MNNVL m`` (2.20+), ``Channel 00/24 :
0 1 2 3`` (each ring's order, printed by rank 0 only; cut with ``...`` past 128 characters),
``Trees [0] 1/-1/-1->0->-1 ...`` (per channel: children/.../->rank->parent), ``Connected all rings``
(2.24+: ``, use ring PXN P GDR G``), ``Connected all trees``, ``Connected NVLS tree``, ``rank R
Connected CollNet``, ``N coll channels, [M collnet channels, ]K nvls channels, ...`` and the init lines
``[FUNC ]comm 0x.. rank R nranks N cudaDev C [nvmlDev V ]busId B ... - Init START|COMPLETE``.

Since 2.22 NCCL connects at the first collective that needs a connection (NCCL_RUNTIME_CONNECT=1):
a log shows the connections of the algorithms that ran, e.g. tree connections only if Tree ran.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import asdict, dataclass, field

from . import ncclog

# "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0" (2.12+: /connection index), "Channel 00 : 0[c1000] ->
# 1[c2000] via direct shared memory" (<= 2.8 wording for SHM), "Ring 00 : 15[41000] -> 0[1b000] via P2P/IPC"
# (<= 2.5: "Ring" for the channel; NET lines without brackets: "Ring 00 : 3 -> 4 [send] via NET/IB/0")
_CONN = re.compile(r"^(?P<word>Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[(?P<sdev>[0-9a-fA-F]+)\])? "
                   r"-> (?P<dst>\d+)(?:\[(?P<ddev>[0-9a-fA-F]+)\])?(?: \[(?P<side>send|receive)\])? via "
                   r"(?P<via>\S.*?)\s*$")
_RING = re.compile(r"^Channel (?P<ch>\d+)/(?P<n>\d+) :(?P<body>[\s\d]*?)(?P<cut>\.\.\.)?\s*$")
_OLD_RING = re.compile(r"^Ring (?P<ch>\d+) :(?P<body>(?: +\d+)+)\s*$")  # <= 2.5: "Ring 00 : 0 1 2 3"
_NEIGHBOURS = re.compile(r"^Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>\d+) -> (?P<next>-?\d+)\s*$")
_TREE_LINE = re.compile(r"^Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<rank>\d+) -> (?P<kids>-?\d+(?:/-?\d+)*)\s*$")  # 2.19+
_OLD_RANK = re.compile(r"^(?:comm (?P<comm>0x[0-9a-fA-F]+) )?rank (?P<rank>\d+) nranks (?P<nranks>\d+)\s*$")  # <= 2.3
_TREES = re.compile(r"^Trees(?P<body>(?: \[\d+\] [-\d/>|]+)*)")
_TREE = re.compile(r"\[(\d+)\] ([-\d/>|]+)")
# RCCL (and some builds) append " comm 0x.. nRanks N[ busId B]" to Trees and connection lines
_SUFFIX = re.compile(r"\s+comm (?P<comm>0x[0-9a-fA-F]+) nRanks (?P<nranks>\d+)(?: busId (?P<bus>[0-9a-fA-F]+))?\s*$")
_TRACE = re.compile(r"^[\w./-]+\.\w+:\d+ -> \d+")  # "transport.cc:68 -> 1": an error handed up
_COMM = re.compile(r"^comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) "
                   r"nNodes (?P<nnodes>\d+) localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+)"
                   r"(?: MNNVL (?P<mnnvl>\d+))?")
_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>\d+)"
                   r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-fA-F]+)\b)?.*- Init (?P<what>START|COMPLETE)\s*$")
_CONNECTED = re.compile(r"^(?:rank \d+ )?Connected (?P<what>all rings|all trees|NVLS tree|CollNet|Collnet Chains|"
                        r"collnet \+ chain)(?:, use ring PXN (?P<pxn>\d+) GDR (?P<gdr>\d+))?")
_CHANNELS = re.compile(r"^(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?P<nvls>\d+) nvls "
                       r"channels, (?P<p2p>\d+) p2p channels, (?P<peer>\d+) p2p channels per peer")
_COLLNET = re.compile(r"^CollNet (?P<ch>\d+)/(?P<conn>\d+) : (?P<rank>\d+) \[(?P<side>send|receive)\] via "
                      r"(?P<via>COLLNET/\S.*?)\s*$")
_NVLS = re.compile(r"^NVLS multicast support is (?P<not>not )?available on dev (?P<dev>\d+)"
                   r"(?: \(NVLS_NCHANNELS (?P<n>\d+)\))?")
_P2P_OFF = re.compile(r"^P2P is disabled between connected GPUs (?P<a>\d+) and (?P<b>\d+)")
_VERSION = re.compile(r"^NCCL version (?P<v>\d+)\.(?P<m>\d+)\.(?P<p>\d+)")
_NETWORK = re.compile(r"^(?:Using network \S+|NET/\S+ ?: .*|Bootstrap ?: Using .*|Using non-device net plugin.*|"
                      r"Failed to open libibverbs.*|NET/Plugin.*)$")
# lines that look like a connection or a graph but none of the forms above: named, never skipped silently
_LOOKS_LIKE = re.compile(r"^(?:Channel \d+|Ring \d+|Trees|Tree \d+)\b| via (?:P2P|SHM|NET|COLLNET)")
_NVLINK = re.compile(r"type NVL/|\+ NVL\[|\(\d+/[\d.]+/NVL\)")  # GRAPH: pattern line, topology tree, paths
_AFFINITY = re.compile(r"^Setting affinity for GPU (?P<gpu>\d+) to")

P2P, SHM, NET = "P2P", "SHM", "NET"


@dataclass(frozen=True)
class Connection:
    """One ``Channel ... via ...`` line: a connection from one rank's GPU to another's on one channel."""

    channel: int
    conn_index: int | None  # None: SHM (and NCCL < 2.12) print no connection index
    src_rank: int
    src_gpu: str  # "3" (NVML index), or "bus:3b000" where NCCL printed a PCI bus id (< 2.18.3)
    dst_rank: int
    dst_gpu: str
    via: str  # what follows "via", verbatim: "P2P/CUMEM/read", "SHM/direct/direct", "NET/IB/0/GDRDMA"
    side: str | None = None  # NET: "send" or "receive" (which end printed it)
    failed: str | None = None  # the WARN that NCCL printed right after this line, in the same thread

    @property
    def kind(self) -> str:
        """P2P, SHM, NET (or what NCCL printed before the first slash)."""
        return kind_of(self.via)


def kind_of(via: str) -> str:
    """P2P, SHM, NET: NCCL <= 2.8 said "direct shared memory" for SHM."""
    return SHM if via.startswith("direct shared memory") else via.split("/", 1)[0]


@dataclass
class Comm:
    """One communicator as one rank saw it at init (a process may hold several)."""

    comm: str
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    mnnvl: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    rings: dict[int, list[int]] = field(default_factory=dict)  # channel -> ring order (rank 0 prints them)
    rings_cut: bool = False  # NCCL cut a ring line short ("..."): orders are partial
    trees: dict[int, tuple[list[int], int]] = field(default_factory=dict)  # channel -> (children, parent)
    channels: dict[str, int] = field(default_factory=dict)  # coll, collnet, nvls, p2p, p2p_per_peer


@dataclass
class ProcessTransports:
    """What one NCCL process said about its connections."""

    host: str
    pid: int | None
    device: int | None
    version: str | None = None
    comms: list[Comm] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    connected: list[str] = field(default_factory=list)  # "all rings (PXN 0, GDR 1)", "all trees", ...
    collnet: list[str] = field(default_factory=list)  # CollNet lines, verbatim after the prefix
    nvls: list[str] = field(default_factory=list)  # NVLS availability lines
    p2p_disabled: list[tuple[int, int]] = field(default_factory=list)  # NCCL: P2P disabled by NVML
    devices: list[int] = field(default_factory=list)  # every [dev] its lines showed (several: -g 8, CommInitAll)
    ranks: dict[int, list[int]] = field(default_factory=dict)  # dev -> the ranks it was seen as (-1: dev unknown)
    tag_rank: int | None = None  # the launcher's tag ([1,N]<stdout>:, "[N] ")
    tag_ip: str | None = None  # Ray's ip=
    nvml: dict[int, int] = field(default_factory=dict)  # cudaDev -> NVML index ("Setting affinity for GPU N")
    network: list[str] = field(default_factory=list)  # "Using network IB", "NET/IB : No device found.", ...
    forms: list[str] = field(default_factory=list)  # older forms seen (each names its NCCL versions)
    unknown: list[str] = field(default_factory=list)  # lines that look like connections/graphs, form unknown
    bus: dict[str, int] = field(default_factory=dict)  # PCI bus id -> cudaDev, from this process's own lines
    nvlink: bool = False  # the topology NCCL printed (GRAPH lines) shows NVLink: "type NVL/...", "NVL["

    def to_json(self) -> dict:
        d = asdict(self)
        for c in d["comms"]:
            c["rings"] = {str(k): v for k, v in c["rings"].items()}
            c["trees"] = {str(k): {"children": v[0], "parent": v[1]} for k, v in c["trees"].items()}
        return d

    def saw_rank(self, dev: int | None, rank: int) -> None:
        seen = self.ranks.setdefault(-1 if dev is None else dev, [])
        if rank not in seen:
            seen.append(rank)

    def form(self, text: str) -> None:
        if text not in self.forms:
            self.forms.append(text)


def _version_tuple(text: str | None) -> tuple[int, int, int] | None:
    m = _VERSION.match(f"NCCL version {text}") if text else None
    return (int(m["v"]), int(m["m"]), int(m["p"])) if m else None


class _State:
    """Parser state: processes by (host, pid), and the communicator each thread last initialised."""

    def __init__(self) -> None:
        self.procs: dict[tuple[str, int | None], ProcessTransports] = {}
        self.current: dict[tuple, Comm] = {}  # (host, pid, tid) -> comm being initialised
        self.by_ptr: dict[tuple, Comm] = {}
        self.last_conn: dict[tuple, int] = {}  # (host, pid, tid) -> index of its last connection line

    def comm(self, key: tuple, ptr: str) -> Comm:
        k = (*key, ptr)
        if k not in self.by_ptr:
            self.by_ptr[k] = Comm(ptr)
            self.procs[key].comms.append(self.by_ptr[k])
        return self.by_ptr[k]


FORM_SHM_WORDS = "'via direct shared memory' (NCCL <= 2.8's word for SHM)"
FORM_RING_CONN = "'Ring NN : a -> b via ...' connection lines (NCCL <= 2.5)"
FORM_OLD_RING = "'Ring NN : 0 1 2 ...' ring lines (NCCL <= 2.5)"
FORM_DOUBLE_TREE = "double binary trees 'a/b/c->r->p|p->r->a/b/c' (NCCL 2.5-2.7)"
FORM_NO_CONN_INDEX = "connection lines without a connection index 'Channel NN : ...' (NCCL < 2.12)"


def feed(state: _State, line: str) -> bool:
    """Take one log line; True when it held a record this module reads."""
    took = False
    for rec in ncclog.records(line):
        took = feed_record(state, rec) or took
    return took


def feed_record(state: _State, rec: ncclog.Record) -> bool:
    """Take one NCCL record (``ncclog.records``); True when it was one this module reads."""
    key = rec.proc
    proc = state.procs.get(key)
    if proc is None:
        proc = state.procs[key] = ProcessTransports(key[0], key[1], rec.dev)
    if rec.dev is not None and rec.dev not in proc.devices:
        proc.devices.append(rec.dev)
    if proc.tag_rank is None and rec.tag_rank is not None:
        proc.tag_rank = rec.tag_rank
    if proc.tag_ip is None and rec.tag_ip is not None:
        proc.tag_ip = rec.tag_ip
    thread = (*key, rec.tid)
    msg = rec.msg
    if rec.level == "WARN":
        at = state.last_conn.pop(thread, None)
        if at is not None:  # the connection this thread had just set up failed
            c = proc.connections[at]
            proc.connections[at] = Connection(c.channel, c.conn_index, c.src_rank, c.src_gpu, c.dst_rank,
                                              c.dst_gpu, c.via, c.side, msg)
        return False
    if rec.level != "INFO":
        return False
    if _TRACE.match(msg):
        return False
    state.last_conn.pop(thread, None)
    suffix = _SUFFIX.search(msg)
    if suffix:
        msg = msg[:suffix.start()]
        if suffix["bus"] and rec.dev is not None:  # "... comm 0x.. nRanks 8 busId c6000": this process's GPU
            proc.bus.setdefault(suffix["bus"].lower(), rec.dev)
    if msg.startswith(("Channel ", "Ring ")):
        if (c := _CONN.match(msg)):
            conn = Connection(int(c["ch"]), int(c["conn"]) if c["conn"] is not None else None, int(c["src"]),
                              c["sdev"] if c["sdev"] is not None else "?", int(c["dst"]),
                              c["ddev"] if c["ddev"] is not None else "?", c["via"], c["side"])
            proc.connections.append(conn)
            state.last_conn[thread] = len(proc.connections) - 1
            mine, my_gpu = (conn.dst_rank, c["ddev"]) if conn.side == "receive" else (conn.src_rank, c["sdev"])
            proc.saw_rank(rec.dev, mine)
            if my_gpu is not None and rec.dev is not None and _bus_like(my_gpu):
                proc.bus.setdefault(my_gpu.lower(), rec.dev)
            if conn.via.startswith("direct shared memory"):
                proc.form(FORM_SHM_WORDS)
            if c["word"] == "Ring":
                proc.form(FORM_RING_CONN)
            if suffix:
                _suffix_comm(state, key, rec, suffix)
            return True
        if (r := _RING.match(msg)):
            comm = _current(state, key, thread)
            ranks = r["body"].split()
            if r["cut"]:
                comm.rings_cut = True
                if r["body"] and not r["body"][-1].isspace() and ranks:
                    ranks = ranks[:-1]  # NCCL wrote "..." over the end of the last number
            comm.rings[int(r["ch"])] = [int(x) for x in ranks]
            proc.saw_rank(rec.dev, 0)  # rank 0 prints the rings
            if comm.rank is None:
                comm.rank = 0
            return True
        if (n := _NEIGHBOURS.match(msg)):
            proc.saw_rank(rec.dev, int(n["rank"]))
            return True
        if (r := _OLD_RING.match(msg)):
            comm = _current(state, key, thread)
            comm.rings[int(r["ch"])] = [int(x) for x in r["body"].split()]
            proc.saw_rank(rec.dev, 0)
            proc.form(FORM_OLD_RING)
            return True
        proc.unknown.append(msg)
        return False
    if (v := _VERSION.match(msg)):
        proc.version = msg[len("NCCL version "):].split()[0]
        return True
    if (c := _COMM.match(msg)):
        comm = state.comm(key, c["comm"])
        comm.rank, comm.nranks, comm.nnodes = int(c["rank"]), int(c["nranks"]), int(c["nnodes"])
        comm.local_ranks = int(c["lranks"])
        comm.mnnvl = int(c["mnnvl"]) if c["mnnvl"] is not None else None
        state.current[thread] = comm
        proc.saw_rank(rec.dev, comm.rank)
        return True
    if (i := _INIT.search(msg)):
        comm = state.comm(key, i["comm"])
        comm.rank, comm.nranks, comm.cuda_dev = int(i["rank"]), int(i["nranks"]), int(i["cuda"])
        comm.nvml_dev = int(i["nvml"]) if i["nvml"] is not None else None
        if i["bus"]:  # NCCL <= 2.6 printed no busId
            comm.bus_id = i["bus"].lower()
            proc.bus.setdefault(comm.bus_id, comm.cuda_dev)
        if i["what"] == "START":
            state.current[thread] = comm
        proc.saw_rank(comm.cuda_dev, comm.rank)
        return True
    if (t := _TREE_LINE.match(msg)):
        comm = _current(state, key, thread)
        kids = [int(x) for x in t["kids"].split("/") if int(x) >= 0]
        comm.trees.setdefault(int(t["ch"]), (kids, int(t["up"])))
        proc.saw_rank(rec.dev, int(t["rank"]))
        if comm.rank is None:
            comm.rank = int(t["rank"])
        return True
    if (o := _OLD_RANK.match(msg)):
        if o["comm"]:
            comm = state.comm(key, o["comm"])
            comm.rank, comm.nranks = int(o["rank"]), int(o["nranks"])
        proc.saw_rank(rec.dev, int(o["rank"]))
        return True
    if (t := _TREES.match(msg)):
        comm = _current(state, key, thread)
        if suffix:
            comm = _suffix_comm(state, key, rec, suffix)
        for ch, body in _TREE.findall(t["body"]):
            parts = body.split("|")
            if len(parts) > 1:
                proc.form(FORM_DOUBLE_TREE)
            tree = _tree(parts[0])
            if tree is None:
                proc.unknown.append(msg)
                break
            children, rank, parent = tree
            comm.trees[int(ch)] = (children, parent)
            proc.saw_rank(rec.dev, rank)
            if comm.rank is None:
                comm.rank = rank
        return True
    if (c := _CHANNELS.match(msg)):
        comm = state.current.get(thread)
        if comm is not None:
            comm.channels = {k: int(v) for k, v in (("coll", c["coll"]), ("collnet", c["collnet"]),
                                                      ("nvls", c["nvls"]), ("p2p", c["p2p"]),
                                                      ("p2p_per_peer", c["peer"])) if v is not None}
        return True
    if (c := _CONNECTED.match(msg)):
        what = c["what"] + (f" (PXN {c['pxn']}, GDR {c['gdr']})" if c["pxn"] is not None else "")
        proc.connected.append(what)
        return True
    if _COLLNET.match(msg):
        proc.collnet.append(msg)
        return True
    if _NVLS.match(msg):
        proc.nvls.append(msg)
        return True
    if (p := _P2P_OFF.match(msg)):
        proc.p2p_disabled.append((int(p["a"]), int(p["b"])))
        return True
    if _NETWORK.match(msg):
        if msg not in proc.network and len(proc.network) < 16:
            proc.network.append(msg)
        return True
    if _NVLINK.search(msg):
        proc.nvlink = True
        return True
    if (a := _AFFINITY.match(msg)):
        if rec.dev is not None:
            proc.nvml.setdefault(rec.dev, int(a["gpu"]))
        return True
    if _LOOKS_LIKE.search(msg):
        proc.unknown.append(msg)
    return False


def _current(state: _State, key: tuple, thread: tuple) -> Comm:
    comm = state.current.get(thread)
    if comm is None:
        comm = state.comm(key, f"unnamed-{thread[2]}")
        state.current[thread] = comm
    return comm


def _suffix_comm(state: _State, key: tuple, rec: ncclog.Record, m: re.Match) -> Comm:
    comm = state.comm(key, m["comm"])
    comm.nranks = int(m["nranks"])
    if m["bus"] and rec.dev is not None:
        comm.bus_id = m["bus"].lower()
        comm.cuda_dev = rec.dev
        state.procs[key].bus.setdefault(comm.bus_id, rec.dev)
    return comm


def _tree(part: str) -> tuple[list[int], int, int] | None:
    """One tree of a Trees entry: "c0/c1/c2->rank->parent" (2.5+; the second of a 2.5-2.7 double tree is
    written "parent->rank->c0/c1/c2"); (children, rank, parent), None for another form."""
    bits = part.split("->")
    if len(bits) != 3 or not bits[1].lstrip("-").isdigit():
        return None
    a, rank, b = bits
    kids, up = (a, b) if "/" in a else (b, a)
    try:
        children = [int(x) for x in kids.split("/") if int(x) >= 0]
        return children, int(rank), int(up)
    except ValueError:
        return None


def _bus_like(text: str) -> bool:
    """A bracket that can only be a PCI bus id (``%lx``, NCCL < 2.18.3): hex letters, or >= 0x1000."""
    return len(text) >= 4 or any(ch in "abcdefABCDEF" for ch in text)


def parse_records(recs, extra=()) -> dict[tuple[str, int | None], ProcessTransports]:
    """(host, pid) -> ProcessTransports for every NCCL process in ``recs`` (``ncclog.Record``).  ``extra``:
    (host, pid, bus, dev, rank) known from outside NCCL's lines (nccl-tests' device lines)."""
    state = _State()
    for rec in recs:
        feed_record(state, rec)
    for host, pid, bus, dev, rank in extra:
        proc = state.procs.setdefault((host, pid), ProcessTransports(host, pid, dev))
        if dev not in proc.devices:
            proc.devices.append(dev)
        if bus:
            proc.bus.setdefault(bus, dev)
        proc.saw_rank(dev, rank)
    _resolve_all(state.procs.values())
    return state.procs


def parse_lines(lines) -> dict[tuple[str, int | None], ProcessTransports]:
    """(host, pid) -> ProcessTransports for every NCCL process in ``lines`` (other lines ignored)."""
    return parse_records(r for line in lines for r in ncclog.records(line))


def parse(text: str) -> dict[tuple[str, int | None], ProcessTransports]:
    return parse_lines(text.splitlines())


def _resolve_all(procs, extra_bus: dict[tuple[str, str], int] | None = None) -> None:
    """Brackets that hold PCI bus ids (NCCL < 2.18.3; a log without a version line shows it by the ids
    themselves) become GPU numbers where each host's bus ids map one to one onto CUDA devices (the init
    lines, the sender's own ``[dev]``, nccl-tests' device lines); else they stay ``bus:c1000``."""
    procs = list(procs)
    any_bus = any(_bus_like(g) for p in procs for c in p.connections for g in (c.src_gpu, c.dst_gpu) if g != "?")
    per_host: dict[str, dict[str, set]] = {}
    for p in procs:
        for b, d in p.bus.items():
            per_host.setdefault(p.host, {}).setdefault(b, set()).add(d)
    for (h, b), d in (extra_bus or {}).items():
        per_host.setdefault(h, {}).setdefault(b.lower(), set()).add(d)
    maps = {}
    for h, m in per_host.items():
        devs = [next(iter(v)) for v in m.values() if len(v) == 1]
        one_to_one = all(len(v) == 1 for v in m.values()) and len(set(devs)) == len(devs)
        maps[h] = {b: next(iter(v)) for b, v in m.items()} if one_to_one else {}
    for p in procs:
        v = _version_tuple(p.version)
        if v is not None and v >= (2, 18, 3):
            continue
        if v is None and not any_bus:
            continue
        bus = maps.get(p.host, {})

        def gpu(text: str, via: str, _bus=bus, _v=v) -> str:
            if text == "?":
                return text
            if via.startswith("P2P/CUMEM") and _v is not None and not _bus_like(text):
                return str(int(text, 16))  # 2.18.1 printed cudaDev with %x for P2P/CUMEM
            found = _bus.get(text.lower())
            return str(found) if found is not None else f"bus:{text.lower()}"

        if p.connections and (any_bus or v is not None):
            p.form("PCI bus ids in the connection lines' brackets (NCCL < 2.18.3)")
        p.connections = [Connection(c.channel, c.conn_index, c.src_rank, _local(gpu, c, "src"), c.dst_rank,
                                    _local(gpu, c, "dst"), c.via, c.side, c.failed) for c in p.connections]


def _local(gpu, c: Connection, end: str) -> str:
    """The printing host's map applies to its own end and to P2P/SHM peers (same host); a NET line's far
    end is another node's bus id, kept as one (``pairs`` maps it through that node's processes)."""
    text = c.src_gpu if end == "src" else c.dst_gpu
    far = c.kind == NET and ((end == "dst") != (c.side == "receive"))
    if far:
        return text if text == "?" or not _bus_like(text) else f"bus:{text.lower()}"
    return gpu(text, c.via)


# --------------------------------------------------------------------------- the GPU x GPU matrix


def short_label(via: str) -> str:
    """A matrix cell's name for a transport: P2P (cuMem or IPC: the same path), P2P/read, SHM, NET/IB/GDR."""
    if kind_of(via) == SHM and not via.startswith(SHM):
        return SHM  # "direct shared memory" (NCCL <= 2.8)
    parts = via.split("/")
    kind = parts[0]
    rest = parts[1:]
    if kind == P2P:
        flags = [p for p in rest if p in ("read", "CE")]
        if rest and rest[0] == "indirect":
            via_gpu = rest[1].split("[")[-1].rstrip("]") if len(rest) > 1 else "?"
            return "/".join([f"P2P>{via_gpu}", *flags])
        mech = {"direct pointer": "ptr", "MNNVL": "MNNVL"}.get(rest[0] if rest else "", "")
        return "/".join(x for x in (P2P, mech, *flags) if x)
    if kind == SHM:
        ce = [p for p in rest if p == "CE"]
        return "SHM/CE" if ce else SHM
    if kind == NET:
        name = rest[0] if rest else "?"
        gdr = "/GDR" if any(p.startswith("GDRDMA") for p in rest) else ""
        return f"NET/{name}{gdr}"
    return via[:12]


@dataclass(frozen=True)
class PairTransport:
    """What NCCL used from one GPU to another: each transport (verbatim) with the channels it served."""

    src: str
    dst: str
    channels: dict[str, list[list]]  # via -> sorted [channel, conn_index] pairs
    failed: dict[str, str] = field(default_factory=dict)  # via -> the WARN its setup failed with

    @property
    def labels(self) -> dict[str, int]:
        """short label -> number of (channel, connection) slots it served."""
        out: dict[str, int] = {}
        for via, slots in self.channels.items():
            name = short_label(via) + ("(failed)" if via in self.failed else "")
            out[name] = out.get(name, 0) + len(slots)
        return out

    def cell(self) -> str:
        labels = self.labels
        if len(labels) == 1:
            return next(iter(labels))
        return "+".join(f"{k}{v}" for k, v in sorted(labels.items(), key=lambda kv: (-kv[1], kv[0])))


def bus_maps(procs, extra: list[tuple[str, str, int]] = ()) -> dict[str, dict[str, int]]:
    """host -> {PCI bus id: CUDA device}, only where that host's ids map one to one (processes that each
    see their one GPU as device 0 would fold every GPU onto GPU0).  ``extra``: (host, bus, dev) known
    otherwise (a rank's own device)."""
    per_host: dict[str, dict[str, set]] = {}
    for p in procs:
        for b, d in p.bus.items():
            per_host.setdefault(p.host, {}).setdefault(b, set()).add(d)
    for h, b, d in extra:
        per_host.setdefault(h, {}).setdefault(b, set()).add(d)
    out = {}
    for h, m in per_host.items():
        devs = [next(iter(v)) for v in m.values()]
        if all(len(v) == 1 for v in m.values()) and len(set(devs)) == len(devs):
            out[h] = {b: next(iter(v)) for b, v in m.items()}
    return out


def multi_node(procs) -> bool:
    """Several nodes: more than one host name in the prefixes, a communicator with nNodes > 1, or
    connections that one node cannot hold (``_more_nodes_than_hosts``: one host's file of a multi-node
    job, two machines with one host name, a redacted host name)."""
    procs = list(procs)
    return (len({p.host for p in procs if p.host != "?"}) > 1
            or any((c.nnodes or 1) > 1 for p in procs for c in p.comms)
            or bool(_more_nodes_than_hosts(procs)))


def _more_nodes_than_hosts(procs) -> list[str]:
    """Why the connections need more nodes than the host names show (empty: they do not):

    * a NET connection between two GPUs of one number (``6[b1000] -> 14[b1000]``): a GPU never sends to
      itself over the network, so the two ends are on two nodes;
    * two processes of one host name that each print the same GPU as their own end: one GPU has one
      process, so they run on two machines (host names repeat, or were redacted);
    * a NET connection to a rank no process of the host was seen as, from a host whose other pairs use
      P2P or SHM: the network is then the way to another node."""
    why = []
    own: dict[tuple[str, str], set] = {}
    ranks_of: dict[str, set] = {}
    boxed: set[str] = set()
    for q in procs:
        ranks_of.setdefault(q.host, set()).update(r for rs in q.ranks.values() for r in rs)
        if any(c.kind in (P2P, SHM) for c in q.connections):
            boxed.add(q.host)
    for p in procs:
        ranks_here, in_box = ranks_of[p.host], p.host in boxed
        for c in p.connections:
            mine = c.dst_gpu if c.side == "receive" else c.src_gpu
            if mine != "?":
                own.setdefault((p.host, mine), set()).add(p.pid)
            if c.kind != NET or len(why) >= 4:
                continue
            if c.src_gpu == c.dst_gpu and c.src_gpu != "?":
                why.append(f"{p.host}: NET between two GPUs numbered {c.src_gpu} (ranks {c.src_rank} and {c.dst_rank})")
            far = c.src_rank if c.side == "receive" else c.dst_rank
            if in_box and far not in ranks_here:
                why.append(f"{p.host}: NET to rank {far}, which no process of {p.host} was seen as")
            why = list(dict.fromkeys(why))
    for (host, gpu), pids in own.items():
        if len(pids) > 1:
            why.append(f"{host}: processes {', '.join(str(x) for x in sorted(pids, key=str)[:4])} each print GPU {gpu} "
                       "as their own")
    return why


def rank_hosts(procs) -> dict[int, set[str]]:
    """rank -> the hosts of the processes that were seen as that rank (one host: where it runs)."""
    out: dict[int, set[str]] = {}
    for p in procs:
        for ranks in p.ranks.values():
            for r in ranks:
                out.setdefault(r, set()).add(p.host)
        if p.tag_rank is not None and not p.ranks:
            out.setdefault(p.tag_rank, set()).add(p.host)
    return out


def resolve(procs, multi: bool | None = None) -> tuple[list[tuple], dict[str, dict]]:
    """Every connection with both endpoints resolved: [(endpoint, endpoint, Connection)], and per endpoint
    label its host, ranks and GPU.  On one node an endpoint is its GPU ("3"); on several it is rank and GPU
    ("r8/GPU0") with the node it runs on, so a cross-node pair never folds onto an in-box one.  A PCI bus
    id (NCCL < 2.18.3) becomes a GPU number where every bus id of its host maps one to one onto a CUDA
    device; else every endpoint of that host stays a bus id ("bus:c1000"), never half of them."""
    procs = list(procs)
    if multi is None:
        multi = multi_node(procs)
    hosts_of = rank_hosts(procs)
    rank_devs: dict[int, set] = {}
    for p in procs:
        for dev, ranks in p.ranks.items():
            for r in ranks:
                if dev >= 0:
                    rank_devs.setdefault(r, set()).add((p.host, dev))
    raw = []
    extra = []
    for proc in procs:
        for c in dict.fromkeys(proc.connections):  # a server's log repeats its inits: each line once
            printer = "dst" if c.side == "receive" else "src"
            ends = []
            for end in ("src", "dst"):
                rank, gpu = (c.src_rank, c.src_gpu) if end == "src" else (c.dst_rank, c.dst_gpu)
                host: str | None = proc.host
                if c.kind == NET and end != printer:
                    found = hosts_of.get(rank, set())
                    if len(found) > 1:  # rank numbers of several communicators: the network goes elsewhere
                        found = found - {proc.host}
                    host = next(iter(found)) if len(found) == 1 else (None if multi else proc.host)
                devs = {d for h, d in rank_devs.get(rank, ()) if h == host} if host is not None else set()
                if gpu.startswith("bus:") and len(devs) == 1:
                    extra.append((host, gpu[4:], next(iter(devs))))
                if gpu == "?" and len(devs) == 1:  # NCCL <= 2.4's NET lines print no brackets
                    gpu = str(next(iter(devs)))
                ends.append((rank, gpu, host))
            raw.append((ends, c))
    maps = bus_maps(procs, extra)
    unmapped = {h for ends, _ in raw for _, g, h in ends if g.startswith("bus:") and g[4:] not in maps.get(h, {})}
    back = {h: {str(d): b for b, d in m.items()} for h, m in bus_maps(procs).items()}  # parse mapped these
    firsts = []
    for ends, c in raw:
        labels = []
        for rank, gpu, host in ends:
            if gpu.startswith("bus:") and host is not None and host not in unmapped:
                gpu = str(maps[host][gpu[4:]])
            elif host in unmapped and gpu in back.get(host, {}):
                gpu = f"bus:{back[host][gpu]}"
            label = endpoint(rank, gpu) if multi else (gpu if gpu != "?" else f"r{rank}")
            labels.append((label, None if host in (None, "?") else host, rank, gpu))
        firsts.append((labels, c))
    hosts_of_label: dict[str, set] = {}
    for labels, _ in firsts:
        for label, host, _, _ in labels:
            if host is not None:
                hosts_of_label.setdefault(label, set()).add(host)
    out, info = [], {}
    for labels, c in firsts:
        names = []
        for label, host, rank, gpu in labels:
            if len(hosts_of_label.get(label, ())) > 1:  # two nodes' "r0/GPU0" (two jobs, two communicators)
                label = f"{label}@{host or '?'}"
            e = info.setdefault(label, {"host": host, "ranks": [], "gpu": gpu})
            if rank not in e["ranks"]:
                e["ranks"].append(rank)
            if e["host"] is None:
                e["host"] = host
            names.append(label)
        out.append((names[0], names[1], c))
    return out, info


def pairs(procs, multi: bool | None = None) -> dict[tuple[str, str], PairTransport]:
    """(src, dst) -> PairTransport over every process (a connection line is printed by its sender;
    NET lines by both ends: the sender's line is used, the receiver's only where the sender's log is missing).

    An endpoint is a GPU index ("3") on one node.  Where the log shows several nodes (host names, or a
    communicator with nNodes > 1), GPU indexes repeat on every node (rank 0 and rank 8 both on GPU 0):
    endpoints are then rank and GPU ("r8/GPU0"), or the matrix would fold every cross-node connection
    onto its diagonal (``resolve``)."""
    resolved, _ = resolve(procs, multi)
    send: dict[tuple[str, str], dict[str, set]] = {}
    recv: dict[tuple[str, str], dict[str, set]] = {}
    failed: dict[tuple[str, str], dict[str, str]] = {}
    for a, b, c in resolved:
        into = recv if c.side == "receive" else send
        into.setdefault((a, b), {}).setdefault(c.via, set()).add((c.channel, -1 if c.conn_index is None
                                                                   else c.conn_index))
        if c.failed:
            failed.setdefault((a, b), {}).setdefault(c.via, c.failed)
    for key, vias in recv.items():
        if key not in send:
            send[key] = vias
    return {k: PairTransport(k[0], k[1], {via: sorted([list(s) for s in slots]) for via, slots in sorted(v.items())},
                             failed.get(k, {}))
            for k, v in sorted(send.items(), key=lambda kv: (_gpu_key(kv[0][0]), _gpu_key(kv[0][1])))}


def endpoint(rank: int, gpu: str) -> str:
    """A matrix endpoint of a multi-node communicator: rank and its GPU on its own node ("r8" where the
    log never shows that rank's GPU)."""
    return f"r{rank}/GPU{gpu}" if gpu.isdigit() else f"r{rank}" if gpu == "?" else f"r{rank}/{gpu}"


def _gpu_key(g: str):
    if g.isdigit():
        return (0, int(g), "")
    rank = re.match(r"r(\d+)(?:/|$)", g)
    return (1, int(rank.group(1)), g) if rank else (2, 0, g)


def matrix_json(procs, multi: bool | None = None) -> dict:
    """run.json / --json form: every pair's transports and channels, the matrix cells, and per endpoint
    its node (``host``), ``ranks`` and ``gpu``; a pair whose setup failed has ``failed`` (via -> WARN)."""
    procs = list(procs)
    if multi is None:
        multi = multi_node(procs)
    found = pairs(procs, multi)
    _, info = resolve(procs, multi)
    gpus = _gpus(found)
    return {"gpus": gpus, "endpoints": {g: info[g] for g in gpus if g in info},
            "pairs": [{"src": p.src, "dst": p.dst, "cell": p.cell(), "transports": p.channels,
                       **({"failed": p.failed} if p.failed else {})} for p in found.values()]}


def _gpus(found) -> list[str]:
    return sorted({g for k in found for g in k}, key=_gpu_key)


WIDTH = 100


def render_matrix(data: dict, indent: str = "  ") -> list[str]:
    """The GPU x GPU matrix of ``matrix_json`` within 100 columns (8 GPUs: 11-column cells; more GPUs:
    one letter per cell), then what each cell name stands for and the channel counts where a pair mixes."""
    gpus, cells = data["gpus"], {(p["src"], p["dst"]): p for p in data["pairs"]}
    if not gpus:
        return [f"{indent}no connection lines (NCCL prints them with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS "
                "including INIT, when the first collective connects)"]
    name = lambda g: f"GPU{g}" if g.isdigit() else g  # noqa: E731 (never cut: two endpoints would read alike)
    first = max(6, max(len(name(g)) for g in gpus) + 1)
    cw = max(5, max([len(p["cell"]) for p in data["pairs"]] + [len(name(g)) for g in gpus]) + 1)
    letters = len(indent) + first + cw * len(gpus) > WIDTH
    cols, placed = [name(g) for g in gpus], False
    codes = letter_codes(data["pairs"])
    if letters:
        cols, placed = _column_labels(gpus)
        if placed:  # the rows say the place their column is labelled with
            name = lambda g, _n=name, _at={g: i for i, g in enumerate(gpus)}: f"{_at[g]}:{_n(g)}"  # noqa: E731
            first = max(6, max(len(name(g)) for g in gpus) + 1)
        cw = max([len(c) for c in cols] + [len(c) for c in codes.values()]) + 1
    head = f"{indent}{'from/to':<{first}}" + "".join(f"{c:>{cw}}" for c in cols)
    lines = [head.rstrip()]
    for a in gpus:
        row = []
        for b in gpus:
            p = cells.get((a, b))
            text = "-" if a == b else "." if p is None else p["cell"]
            if letters and p is not None:
                text = "!" if p.get("failed") else codes[next(iter(_labels_of(p)))] if len(_labels_of(p)) == 1 else "*"
            row.append(f"{text:>{cw}}")
        lines.append(f"{indent}{name(a):<{first}}" + "".join(row))
    lines += _legend(data["pairs"], indent, letters)
    if placed:
        lines.insert(len(gpus) + 3, f"{indent}columns are numbered by place: the number before each row's name")
    elif letters and any(_RANK_END.match(g) for g in gpus):
        lines.insert(len(gpus) + 3, f"{indent}columns are labelled by rank: 8 is the column of r8/GPU0")
    out = []
    for l in lines:  # the matrix fits; a legend line too long is wrapped, never cut
        out += textwrap.wrap(l, WIDTH, subsequent_indent=indent + "    ", break_on_hyphens=False) if len(l) > WIDTH \
            else [l]
    return out


def _column_labels(gpus: list[str]) -> tuple[list[str], bool]:
    """Column labels where each cell is one letter: the whole GPU index ("12", not its last digit), or
    the rank of a rank/GPU endpoint ("8" for r8/GPU0: GPU indexes repeat on every node).  Where those
    repeat or are not numbers (two communicators' ranks in one log, a PCI bus id), each endpoint's
    place in the list; True then, and the rows name their place too."""
    short = [m.group(1) if (m := _RANK_END.match(g)) else g for g in gpus]
    if len(set(short)) == len(short) and all(x.isdigit() for x in short):
        return short, False
    return [str(i) for i in range(len(gpus))], True


_RANK_END = re.compile(r"r(\d+)/")


def _rank_keyed(data: dict) -> bool:
    """Whether a matrix's endpoints are rank/GPU (a multi-node communicator, ``pairs``) or GPUs."""
    return any(_RANK_END.match(g) for g in data.get("gpus", []))


def _labels_of(p: dict) -> set[str]:
    return {short_label(v) for v in p["transports"]}


def letter_codes(pair_list: list[dict]) -> dict[str, str]:
    """Cell name -> its code where each cell is one letter: the first letter (P, S, N), numbered where two
    names share it (P1 = P2P, P2 = P2P/read), so one letter never stands for two transports."""
    names = sorted({short_label(v) for p in pair_list for v in p["transports"]})
    by_first: dict[str, list[str]] = {}
    for n in names:
        by_first.setdefault(n[0], []).append(n)
    return {n: (f if len(ns) == 1 else f"{f}{i + 1}") for f, ns in by_first.items() for i, n in enumerate(ns)}


def _legend(pair_list: list[dict], indent: str, letters: bool) -> list[str]:
    """One line per cell name: the transports as NCCL printed them, how many pairs, channels per pair."""
    by_label: dict[str, dict[str, list[int]]] = {}
    for p in pair_list:
        for via, slots in p["transports"].items():
            by_label.setdefault(short_label(via), {}).setdefault(via, []).append(len(slots))
    codes = letter_codes(pair_list)
    ends = "rank/GPU" if any(_RANK_END.match(p["src"]) for p in pair_list) else "GPU"
    out = ["", f"{indent}'.': no connection seen; row: sending {ends}, column: receiving {ends}"]
    for label, vias in sorted(by_label.items()):
        for via, counts in sorted(vias.items()):
            lo, hi = min(counts), max(counts)
            ch = f"{lo}" if lo == hi else f"{lo}-{hi}"
            key = f"{codes[label]} = " if letters else f"{label} = "
            out.append(f"{indent}{key}{via}: {len(counts)} pair(s), {ch} channel(s) each")
    if letters and any(p.get("failed") for p in pair_list):
        out.append(f"{indent}! = a connection whose setup failed (below)")
    for p in pair_list:
        for via, warn in p.get("failed", {}).items():
            out.append(f"{indent}{p['src']}->{p['dst']} via {via}: setup FAILED, NCCL WARN {warn}")
    mixed = [p for p in pair_list if len(p["transports"]) > 1]
    for p in mixed[:16]:
        parts = ", ".join(f"{via[:40]} on {len(slots)}" for via, slots in p["transports"].items())
        out.append(f"{indent}{p['src']}->{p['dst']} mixes transports by channel: {parts}")
    if len(mixed) > 16:
        out.append(f"{indent}... and {len(mixed) - 16} more pairs that mix transports")
    return out


def diff(default: dict, other: dict, baseline: str = "default") -> list[str]:
    """What ``other`` changed against ``default``, grouped: "pairs 0->4, 1->5 moved from SHM to P2P"."""
    if default["pairs"] and other["pairs"] and _rank_keyed(default) != _rank_keyed(other):
        # r8/GPU0 and GPU 0 are not one endpoint: compared by key, every pair would read as moved
        ends = ("rank/GPU (several nodes)", "GPU (one node)")
        here, there = ends if _rank_keyed(other) else ends[::-1]
        return [f"endpoints are {here} here and {there} in {baseline}: the two cannot be compared pair by "
                "pair; see both matrices"]
    a = {(p["src"], p["dst"]): p["cell"] for p in default["pairs"]}
    b = {(p["src"], p["dst"]): p["cell"] for p in other["pairs"]}
    moved: dict[tuple, list[str]] = {}
    for key in sorted(set(a) | set(b), key=lambda k: (_gpu_key(k[0]), _gpu_key(k[1]))):
        old, new = a.get(key), b.get(key)
        if old != new:
            moved.setdefault((old, new), []).append(f"{key[0]}->{key[1]}")
    out = []
    for (old, new), names in moved.items():
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        pairs_ = f"pair{'s' if len(names) > 1 else ''} {shown}"
        if old is None:
            out.append(f"{pairs_}: {new} here, not connected in {baseline}")
        elif new is None:
            out.append(f"{pairs_}: not connected here ({old} in {baseline})")
        else:
            out.append(f"{pairs_} moved from {old} to {new}")
    return out


def summary_json(procs, multi: bool | None = None) -> dict:
    """What explain and check-env store per config/run: the matrix, rings/trees per communicator, and
    the connection summaries (format documented in docs/formats.md, "Transports")."""
    procs = list(procs)
    comms = []
    for p in procs:
        for c in p.comms:
            if c.rings or c.trees or c.nranks:
                comms.append({"pid": p.pid, "host": p.host, "comm": c.comm, "rank": c.rank, "nranks": c.nranks,
                              "nnodes": c.nnodes, "nvml_dev": c.nvml_dev, "cuda_dev": c.cuda_dev,
                              "rings": ring_summary(c), "trees": tree_summary(c), "channels": c.channels})
    return {**matrix_json(procs, multi_node(procs) if multi is None else multi), "comms": comms,
            "connected": sorted({w for p in procs for w in p.connected}),
            "collnet": sum(len(p.collnet) for p in procs), "nvls": sorted({l for p in procs for l in p.nvls}),
            "p2p_disabled": sorted({tuple(x) for p in procs for x in p.p2p_disabled})}


def ring_summary(c: Comm) -> list[dict]:
    """Distinct ring orders and the channels that use each (only rank 0 prints rings)."""
    orders: dict[tuple, list[int]] = {}
    for ch, order in sorted(c.rings.items()):
        orders.setdefault(tuple(order), []).append(ch)
    return [{"order": list(o), "channels": chans, "cut": c.rings_cut} for o, chans in orders.items()]


def tree_summary(c: Comm) -> list[dict]:
    """This rank's distinct tree positions (children, parent) and the channels of each."""
    pos: dict[tuple, list[int]] = {}
    for ch, (children, parent) in sorted(c.trees.items()):
        pos.setdefault((tuple(children), parent), []).append(ch)
    return [{"children": list(k[0]), "parent": k[1], "channels": chans} for k, chans in pos.items()]


def channel_ranges(chans: list[int]) -> str:
    """[0,1,2,5] -> "0-2,5"."""
    out, start, prev = [], None, None
    for c in chans:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(out)


def render_graphs(summary: dict, indent: str = "  ", limit: int = 16) -> list[str]:
    """Rings (from rank 0) and trees (per rank) of every communicator, one line each, within 100 columns."""
    lines = []
    for c in summary["comms"][:limit]:
        comm = "" if c["comm"].startswith("unnamed-") else f" comm {c['comm']}"
        rank = "?" if c["rank"] is None else c["rank"]
        who = f"pid {c['pid']}{comm} rank {rank}" + (f"/{c['nranks']}" if c["nranks"] else "")
        for r in c["rings"]:
            order = " ".join(map(str, r["order"][:24])) + (" ..." if len(r["order"]) > 24 or r["cut"] else "")
            lines.append(f"{indent}{who}: ring {order} on channels {channel_ranges(r['channels'])}")
        for t in c["trees"]:
            kids = ",".join(map(str, t["children"])) or "none"
            lines.append(f"{indent}{who}: tree parent {t['parent']}, children {kids} on channels "
                         f"{channel_ranges(t['channels'])}")
    if len(summary["comms"]) > limit:
        lines.append(f"{indent}... and {len(summary['comms']) - limit} more communicators (see --json)")
    return [l if len(l) <= WIDTH else l[:WIDTH - 3] + "..." for l in lines]


def config_label(name: str, overrides: dict | None) -> str:
    """``p2p-sys (NCCL_P2P_LEVEL=SYS)``: the config and, when short, the settings that make it."""
    if not overrides:
        return name
    settings = " ".join(f"{k}={v}" for k, v in overrides.items())
    return f"{name} ({settings})" if len(settings) <= 60 else name


def render_configs(configs: dict[str, dict], baseline: str = "default", indent: str = "  ") -> list[str]:
    """Per config, its transport matrix (``summary_json``/``matrix_json``) -- once for the baseline, and
    for every other config either "same as default" or what it moved, then its own matrix."""
    have = {n: c for n, c in configs.items() if c.get("transports") is not None}
    if not have:
        return []
    base_name = baseline if baseline in have else next(iter(have))
    base = have[base_name]["transports"]
    lines = ["Transport per GPU pair (row: sending GPU, column: receiving GPU):",
             f"[{config_label(base_name, have[base_name].get('overrides'))}]"]
    lines += render_matrix(base, indent)
    for name, c in have.items():
        if name == base_name:
            continue
        label = config_label(name, c.get("overrides"))
        changes = diff(base, c["transports"], base_name)
        if not changes:
            lines.append(f"[{label}] same transports as {base_name}")
            continue
        lines.append(f"[{label}] against {base_name}:")
        for x in changes:
            lines += textwrap.wrap(x, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                                   break_on_hyphens=False)
        lines += render_matrix(c["transports"], indent)
    return lines
