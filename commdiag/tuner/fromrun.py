"""Rules from a sweep: a run folder's certified per-size winners as tuner rules (``commdiag tuner rules``).

Reads a run folder (never writes into it) and returns what the rules file should say; writing
the file is the CLI's job (``rules.render`` + ``atomic.write_text``).  docs/tuner.md "Rules from
a sweep" is the manual.

Where the answers come from.  Only from ``sweep --certify-sizes``: the one-stage exact test of
every config x size in the run's primary mode (analyse/certify.py ``certify_sizes``, Bonferroni
over all of them, half the run's 1%).  A run without it (band-level verdicts only) is refused
with what to run; band winners say nothing about the sizes inside a band.

Per measured size:
  * the candidates are the configs certified faster than default there (and eligible: no failed
    launch, no wrong sums), best (lowest Hodges-Lehmann ratio) first;
  * a candidate becomes a rule only if its settings differ from default's in nothing but
    NCCL_PROTO (one protocol), NCCL_ALGO (one algorithm) and optionally NCCL_MAX_NCHANNELS, and
    only if the choice is one NCCL would apply and that is safe on this run's machine (``_refusal``);
  * the first candidate that passes is the size's winner; the ones before it are listed with why
    they were passed over.  No candidate: no rule, NCCL decides.

Contiguous measured sizes with the same winning choice merge into one rule from the first size to
the last (inclusive).  Between two blocks, below the first and above the last measured size,
nothing was certified, so no rule covers it: never a midpoint.

Every rule gets ``mode=any``: the sweep forced its choice through the environment, which applies
to every call, graph or eager, so ``any`` is what was measured.  (On 2x H200 with NCCL 2.28.9,
benchmarks/h200x2-2026-11-30-tuner/tuned-p2pon, NCCL passed ``regBuff=1`` for the all-reduces torch
captured into a CUDA graph and ``regBuff=0`` for its eager calls, so a ``mode=graph`` rule would
reach the captured calls only; the first probe (benchmarks/h200x2-2026-11-30/tuner-probe) had seen only eager calls' lines.)
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import CommdiagError
from . import rules as rules_mod
from .rules import Rule

DERIVED_FORMAT = "commdiag-tuner-rules-derived"
DERIVED_VERSION = 1  # 1: the first format (docs/formats.md)

COLL = "allreduce"  # commdiag sweeps time all-reduce; its "bytes" is NCCL's nBytes for it
RULE_MODE = "any"  # module docstring: what the environment forced in the sweep
RULE_VARS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_MAX_NCHANNELS")

# NCCL's names (ncclAlgoStr / ncclProtoStr, matched case-insensitively by NCCL) -> the rules format's
ALGOS = {"tree": "tree", "ring": "ring", "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
         "nvls": "nvls", "nvlstree": "nvls_tree", "pat": "pat"}
PROTOS = {"ll": "ll", "ll128": "ll128", "simple": "simple"}

# What a size's table row says
RULE, NONE_CERTIFIED, NOT_EXPRESSIBLE, REFUSED = "rule", "none certified", "not expressible", "refused"

COMMENT_MAX = 400  # a rules line may hold 512 bytes (rules.MAX_LINE); comments stay well inside it


@dataclass(frozen=True)
class Choice:
    """What a rule chooses: NCCL's algorithm and protocol, and at most this many channels (0: NCCL's)."""

    algo: str
    proto: str
    channels: int = 0

    @property
    def text(self) -> str:
        return f"algo={self.algo} proto={self.proto}" + (f" channels={self.channels}" if self.channels else "")


@dataclass(frozen=True)
class Candidate:
    """A config certified faster than default at one size, and whether it can be a rule."""

    config: str
    ratio: float
    p: float
    choice: Choice | None
    outcome: str  # rule | not expressible | refused
    why: str = ""  # for not expressible / refused

    def to_json(self) -> dict:
        return {"config": self.config, "ratio": self.ratio, "p": self.p,
                "choice": None if self.choice is None else vars(self.choice), "outcome": self.outcome,
                "why": self.why}


@dataclass(frozen=True)
class SizeDecision:
    """One measured size: its winner (if any) and why, and the certified configs passed over."""

    size_bytes: int
    tokens: int | None
    outcome: str  # rule | none certified | not expressible | refused
    winner: Candidate | None  # the candidate that became the rule, or the best one that could not
    passed_over: tuple[Candidate, ...] = ()  # better-ranked candidates that could not become a rule
    tested: int = 0  # configs tested at this size
    slower: tuple[str, ...] = ()  # configs certified slower than default here

    @property
    def text(self) -> str:
        """The table's decision column (the reason for a refusal comes on lines of its own)."""
        if self.outcome == NONE_CERTIFIED:
            return f"none certified ({self.tested} tested" + (f"; slower: {', '.join(self.slower)})" if self.slower
                                                              else ")")
        w = self.winner
        if self.outcome == RULE:
            c = w.choice
            return f"{w.config} -> {c.algo}/{c.proto}" + (f"/{c.channels}ch" if c.channels else "")
        return f"{self.outcome}: {w.config}"

    def to_json(self) -> dict:
        return {"size_bytes": self.size_bytes, "tokens": self.tokens, "outcome": self.outcome,
                "winner": None if self.winner is None else self.winner.to_json(),
                "passed_over": [c.to_json() for c in self.passed_over], "tested": self.tested,
                "slower": list(self.slower), "text": self.text}


@dataclass(frozen=True)
class RulesFromRun:
    """What ``commdiag tuner rules RUN_DIR`` decided: the rules, per size what and why, the file text."""

    run_dir: Path
    nranks: int
    nnodes: int
    mode: str  # the primary mode the sizes were certified in
    threshold: float | None  # the p every per-size claim had to reach
    rules: tuple[Rule, ...]
    sizes: tuple[SizeDecision, ...]
    refusals: tuple[str, ...]  # one line per certified config that could not become a rule, with why
    notes: tuple[str, ...]
    comments: tuple[str, ...]  # the rules file's header comments
    text: str  # the rules file (format 1), checked by parsing it back

    @property
    def certified_any(self) -> bool:
        return any(d.outcome != NONE_CERTIFIED for d in self.sizes)

    @property
    def summary(self) -> str:
        if self.rules:
            return f"{len(self.rules)} rule(s) from {sum(d.outcome == RULE for d in self.sizes)} certified size(s)"
        if not self.certified_any:
            return "no certified per-size winner: keep NCCL's choices"
        return "no rules: every certified per-size winner was refused or is not expressible: keep NCCL's choices"

    def to_json(self) -> dict:
        return {"format": DERIVED_FORMAT, "version": DERIVED_VERSION, "run_dir": str(self.run_dir),
                "nranks": self.nranks, "nnodes": self.nnodes, "mode": self.mode, "rule_mode": RULE_MODE,
                "threshold": self.threshold, "rules": [r.to_line() for r in self.rules],
                "sizes": [d.to_json() for d in self.sizes], "refusals": list(self.refusals),
                "notes": list(self.notes), "summary": self.summary, "text": self.text}


# ------------------------------------------------------------------ the run's facts


def _needs_certify_sizes(run_dir: Path, run: dict, why: str) -> CommdiagError:
    spec = run.get("spec_file") or "SPEC.yaml"
    return CommdiagError(f"{run_dir}: {why}; rules need a certified winner per size: run  commdiag sweep "
                         f"{spec} --certify-sizes  (it raises the trials to what a one-stage exact test of every "
                         f"config x size needs) and give that run folder")


def _choice_of(env: dict, default_env: dict) -> tuple[Choice | None, str]:
    """The rule a config's settings amount to, or why they cannot be one."""
    keys = sorted(set(env) | set(default_env))
    differ = [k for k in keys if str(env.get(k)) != str(default_env.get(k))]
    other = [k for k in differ if k not in RULE_VARS]
    if other:
        return None, (f"{', '.join(other)} {'differs' if len(other) == 1 else 'differ'} from default; a rule "
                      "sets only the algorithm, protocol and "
                      "channels (NCCL_ALGO, NCCL_PROTO, NCCL_MAX_NCHANNELS)")
    if any(k in default_env for k in differ):
        return None, (f"default sets {', '.join(k for k in differ if k in default_env)} too (base_env), so this "
                      "config is not default plus one choice")
    proto_v, algo_v = env.get("NCCL_PROTO"), env.get("NCCL_ALGO")
    if proto_v is None or algo_v is None:
        missing = "NCCL_PROTO" if proto_v is None else "NCCL_ALGO"
        return None, f"{missing} is not set: a rule names both the algorithm and the protocol"
    proto = PROTOS.get(str(proto_v).strip().lower())
    if proto is None:
        return None, f"NCCL_PROTO={str(proto_v)[:40]!r} is not one protocol (LL, LL128 or Simple)"
    algo = ALGOS.get(str(algo_v).strip().lower())
    if algo is None:
        return None, f"NCCL_ALGO={str(algo_v)[:40]!r} is not one algorithm ({', '.join(ALGOS)})"
    channels = 0
    if "NCCL_MAX_NCHANNELS" in env:
        raw = str(env["NCCL_MAX_NCHANNELS"]).strip()
        if not raw.isdigit() or not 1 <= int(raw) <= rules_mod.MAX_CHANNELS:
            return None, f"NCCL_MAX_NCHANNELS={raw[:40]!r} is not 1..{rules_mod.MAX_CHANNELS}"
        channels = int(raw)
    return Choice(algo, proto, channels), ""


def _flag_on(value) -> bool:
    """NCCL reads NCCL_P2P_DISABLE as an integer: anything but 0 disables P2P."""
    v = str(value).strip()
    return bool(v) and v.lstrip("-").isdigit() and int(v) != 0


def _p2p_disabled(run: dict, default_env: dict) -> bool:
    if "NCCL_P2P_DISABLE" in default_env and _flag_on(default_env["NCCL_P2P_DISABLE"]):
        return True
    for l in run.get("launches", []):
        for r in l.get("ranks") or []:
            seen = (r.get("env_seen") or {}).get("NCCL_P2P_DISABLE") if isinstance(r, dict) else None
            if isinstance(seen, dict) and seen.get("getenv") is not None and _flag_on(seen["getenv"]):
                return True
    return False


def recorded_topology(run: dict):
    """The GPU topology the run recorded (``fingerprint.nvml_readings``, the layout of ``detect --json``'s
    ``nvml_readings``, which sweeps of backend nccl record since 2026-11-30), analysed; None when the run
    recorded none (an older run, or NVML was unavailable: ``fingerprint.nvml_readings_error`` says why)."""
    from ..environment import topology

    readings = (run.get("fingerprint") or {}).get("nvml_readings")
    if not isinstance(readings, dict) or not isinstance(readings.get("gpus"), list):
        return None
    try:
        return topology.analyze(readings)
    except (KeyError, TypeError, ValueError):
        return None


def _ll128_problem(run: dict, default_env: dict, nnodes: int, allow: bool) -> tuple[str | None, str | None]:
    """(why LL128 is refused on this run's machine, or None; a note when it is allowed on the user's word)."""
    from ..environment import topology as topo

    if _p2p_disabled(run, default_env):
        return ("NCCL_P2P_DISABLE=1 was in effect: traffic went through host memory, where LL128's 128-byte "
                "stores are not guaranteed to arrive whole"), None
    if nnodes > 1:
        if allow:
            return None, "LL128 allowed across nodes on your word (--allow-ll128): the run records no inter-node path"
        return "LL128 across nodes: the run records no inter-node path (--allow-ll128 if it is safe)", None
    t = recorded_topology(run)
    if t is None:
        if allow:
            return None, ("LL128 allowed on your word (--allow-ll128): the run records no GPU topology, so commdiag "
                          "could not check that every GPU pair is joined by NVLink")
        return ("the run records no GPU topology, so commdiag cannot tell whether every GPU pair is joined by "
                "NVLink (LL128 over PCIe can corrupt data); give --allow-ll128 if they are (commdiag detect "
                "shows it)"), None
    buses = {str(g.get("pci_bus_id", "")).lower()[-12:]
             for g in (run.get("fingerprint") or {}).get("worker", {}).get("gpus", []) if isinstance(g, dict)}
    used = {g.index for g in t.gpus if g.bus_id and g.bus_id.lower()[-12:] in buses}
    pairs = [p for p in t.pairs if not used or (p.i in used and p.j in used)]
    slow = [p for p in pairs if p.kind != topo.NVLINK]
    if not pairs:
        return "the recorded topology has no GPU pair to check (one GPU?)", None
    if slow:
        p = slow[0]
        return (f"GPUs {p.i} and {p.j} are joined by {p.label} ({p.kind}), not NVLink: LL128 over PCIe can "
                "corrupt data"), None
    return None, None


def _refusal(choice: Choice, ll128: str | None, gloo: bool) -> str | None:
    """Why NCCL would ignore this choice, or why it is unsafe here; None when it can be a rule."""
    if gloo:
        return "the run used gloo, which never loads NCCL: its NCCL_* settings changed nothing"
    if choice.algo in ("nvls", "nvls_tree"):
        return ("NVLS needs NVLink SHARP multicast (NVSwitch systems) and commdiag never turns it on for shared "
                "machines; where it is off NCCL disables the choice and the rule would never apply")
    if choice.algo in ("collnet_direct", "collnet_chain"):
        return "CollNet needs a CollNet network plugin (SHARP); without one NCCL disables the choice"
    if choice.algo == "pat" and COLL == "allreduce":
        return "NCCL runs PAT only for all-gather and reduce-scatter: it disables it for all-reduce"
    if choice.proto == "ll128" and ll128:
        return ll128
    return None


# ------------------------------------------------------------------ the decision


def derive(run_dir: str | Path, *, allow_ll128: bool = False, now: _dt.datetime | None = None) -> RulesFromRun:
    """The rules a run folder's certified per-size winners amount to (module docstring).  Read only."""
    from ..analyse import certify, verdict
    from ..formats import results

    run_dir = Path(run_dir)
    run = results.load_run_json(run_dir)
    if not run.get("certify_sizes"):
        raise _needs_certify_sizes(run_dir, run, "no per-size certification: this run was swept without "
                                                 "--certify-sizes (its verdicts, if any, are per band)")
    if any(l.get("status") == results.PENDING and int(l.get("stage", 1)) == 1 for l in run["launches"]):
        raise CommdiagError(f"{run_dir}: the per-size certification is unfinished (stage 1 has pending "
                            f"launches); finish it first: commdiag sweep --resume {run_dir}")
    data = results.load_run(run_dir)
    v = verdict.evaluate_run(data)
    certs = v.size_certifications
    if not certs:
        raise _needs_certify_sizes(run_dir, run, "the per-size certification has no results (no usable launch of "
                                                 "default and another config at any size)")
    nranks = run.get("world_size")
    spec = run["spec"]
    nnodes = spec.get("nnodes", 1)
    if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1 or not isinstance(nnodes, int) \
            or not 1 <= nnodes <= nranks:
        raise CommdiagError(f"{run_dir / 'run.json'}: world_size {nranks!r} / spec.nnodes {nnodes!r}: not a "
                            "communicator size (world_size >= nnodes >= 1)")
    envs = {c["name"]: {k: str(x) for k, x in c["env"].items()} for c in run["configs"]}
    default_env = envs.get("default", {})
    gloo = spec.get("backend") == "gloo"
    ll128, ll128_note = _ll128_problem(run, default_env, nnodes, allow_ll128)
    tokens = {s["bytes"]: s.get("tokens") for s in spec["sizes"]}

    decisions = []
    for size in sorted(tokens):
        here = [c for c in certs if c.claim.size_bytes == size]
        faster = sorted((c for c in here if c.result == certify.FASTER), key=lambda c: (c.ratio, c.claim.config))
        ranked = [_candidate(c, envs, default_env, ll128, gloo) for c in faster]
        usable = next((i for i, c in enumerate(ranked) if c.outcome == RULE), None)
        if usable is not None:
            decisions.append(SizeDecision(size, tokens[size], RULE, ranked[usable], tuple(ranked[:usable]), len(here)))
        elif ranked:
            decisions.append(SizeDecision(size, tokens[size], ranked[0].outcome, ranked[0], tuple(ranked[1:]),
                                          len(here)))
        else:
            slower = tuple(c.claim.config for c in here if c.result == certify.SLOWER)
            decisions.append(SizeDecision(size, tokens[size], NONE_CERTIFIED, None, (), len(here), slower))

    rules = _merge(decisions, nranks, nnodes)
    refusals = tuple(dict.fromkeys(
        f"{d.size_bytes} B: {c.config}: {c.outcome}: {c.why}"
        for d in decisions for c in ((d.winner,) if d.outcome not in (RULE, NONE_CERTIFIED) else ()) + d.passed_over))
    # an A/A twin certified (per size here, or in stage 2): the machine certifies noise, and so may every rule
    notes = [n for n in v.notes if n.startswith("A/A check: FAIL")]
    short = [c for c in certs if c.rounds_to_certify is not None and (c.rounds or 0) < c.rounds_to_certify
             and c.p_floor > c.threshold]
    if short:
        need = max(c.rounds_to_certify for c in short)
        notes.append(f"{len(short)} of {len(certs)} size x config claims had too few complete trials to reach "
                     f"p <= {certs[0].threshold:.2g} with the paired test by trial ({need} needed); a new "
                     f"sweep --certify-sizes plans them (a run swept before per-size claims were paired by "
                     "trial has too few)")
    if ll128_note:
        notes.append(ll128_note)
    if gloo:
        notes.append("gloo never loads NCCL: a gloo run can show how certification behaves, never what NCCL should "
                     "choose")
    if v.primary_mode != "graph" and v.primary_mode is not None:
        notes.append(f"certified in {v.primary_mode} mode: the rules apply to every call (mode=any)")
    else:
        notes.append("certified in graph mode (CUDA graphs); the rules apply to every call (mode=any), as the "
                     "sweep's environment forced each choice on every call, graph and eager alike")
    if rules and len(rules) > rules_mod.MAX_RULES:
        raise CommdiagError(f"{run_dir}: {len(rules)} rules: more than the plugin reads ({rules_mod.MAX_RULES})")
    threshold = certs[0].threshold if certs else None
    comments = _comments(run_dir, run, rules, decisions, v.primary_mode, threshold, now)
    text = rules_mod.render(list(rules), comments)
    return RulesFromRun(run_dir, nranks, nnodes, v.primary_mode, threshold, tuple(rules), tuple(decisions), refusals,
                        tuple(notes), comments, text)


def rules_text(run_dir: Path, *, allow_ll128: bool = False) -> str:
    """The rules file (format 1) for a run folder's certified per-size winners.  With no winner it holds
    the header and comments but no rule: the plugin then leaves every choice to NCCL."""
    return derive(run_dir, allow_ll128=allow_ll128).text


def _candidate(cert, envs: dict, default_env: dict, ll128: str | None, gloo: bool) -> Candidate:
    name = cert.claim.config
    if not cert.eligible:
        return Candidate(name, cert.ratio, cert.p, None, REFUSED, "a launch of it failed or gave wrong sums")
    choice, why = _choice_of(envs.get(name, {}), default_env)
    if choice is None:
        return Candidate(name, cert.ratio, cert.p, None, NOT_EXPRESSIBLE, why)
    refused = _refusal(choice, ll128, gloo)
    if refused:
        return Candidate(name, cert.ratio, cert.p, choice, REFUSED, refused)
    return Candidate(name, cert.ratio, cert.p, choice, RULE)


def _merge(decisions: list[SizeDecision], nranks: int, nnodes: int) -> list[Rule]:
    """Runs of adjacent measured sizes with the same winning choice -> one rule, first size to last size."""
    out: list[Rule] = []
    prev: SizeDecision | None = None
    for d in decisions:
        if d.outcome == RULE and prev is not None and prev.outcome == RULE and prev.winner.choice == d.winner.choice:
            last = out[-1]
            out[-1] = Rule(last.coll, last.min_bytes, d.size_bytes, nranks, nnodes, last.algo, last.proto,
                           last.channels, last.mode)
        elif d.outcome == RULE:
            c = d.winner.choice
            out.append(Rule(COLL, d.size_bytes, d.size_bytes, nranks, nnodes, c.algo, c.proto, c.channels, RULE_MODE))
        prev = d
    return out


def comment_safe(text: str, limit: int = COMMENT_MAX) -> str:
    """``text`` as one rules-file comment: printable ASCII only (anything else, newlines included, becomes
    ``?``), at most ``limit`` characters.  Run folder and config names can hold anything."""
    clean = "".join(ch if " " <= ch < "\x7f" else "?" for ch in str(text))
    return clean if len(clean) <= limit else clean[:limit - 3] + "..."


def _comments(run_dir: Path, run: dict, rules: list[Rule], decisions: list[SizeDecision], mode: str | None,
              threshold: float | None, now: _dt.datetime | None) -> tuple[str, ...]:
    when = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"generated by commdiag {__version__} from {run_dir.absolute()}",
             f"date {when}; run created {run.get('created_utc') or '?'}",
             f"per-size certification (--certify-sizes), {mode} mode: paired signed-rank test by trial vs default, each size x config "
             f"at p <= {threshold:.2g}" if threshold is not None else "per-size certification (--certify-sizes)",
             "one rule per run of adjacent measured sizes with the same certified winner, first to last size; "
             "sizes in between runs and outside them: NCCL decides",
             "mode=any: what the sweep's environment forced (every call, graph and eager)"]
    if not rules:
        lines.append("no rules: no certified per-size winner could become a rule; NCCL keeps every choice")
    by_size = {d.size_bytes: d for d in decisions}
    for n, r in enumerate(rules, 1):
        lines.append(f"rule {n}: {r.min_bytes}..{r.max_bytes} B, {r.algo}/{r.proto}"
                     + (f" channels {r.channels}" if r.channels else "") + ", certified at:")
        for s in sorted(s for s in by_size if r.min_bytes <= s <= r.max_bytes):
            w = by_size[s].winner
            tok = f" ({by_size[s].tokens} tok)" if by_size[s].tokens is not None else ""
            lines.append(f"  {s} B{tok}: {w.config} ratio {w.ratio:.3f} ({(1 - w.ratio) * 100:.1f}% faster), "
                         f"p = {w.p:.2g}")
    return tuple(comment_safe(line) for line in lines)


# ------------------------------------------------------------------ text for the terminal


def render(res: RulesFromRun, out: Path | None = None) -> str:
    """The per-size table (within 100 columns; reasons wrapped below their row), the rules, what next."""
    import textwrap

    from ..analyse.report import _fit

    lines = [f"run folder {res.run_dir}", f"{res.nranks} ranks, {res.nnodes} node(s); per-size certification in "
             f"{res.mode} mode" + (f", each claim at p <= {res.threshold:.2g}" if res.threshold is not None else ""),
             "",
             f"{'size(B)':>10} {'tok':>5}  {'decision':<58} {'ratio':>6} {'p':>8}"]
    wrap = lambda t: textwrap.wrap(t, 100, initial_indent=" " * 19, subsequent_indent=" " * 21)  # noqa: E731
    for d in res.sizes:
        w = d.winner
        ratio = f"{w.ratio:.3f}" if w else "-"
        p = f"{w.p:.2g}" if w else "-"
        tok = "" if d.tokens is None else str(d.tokens)
        lines.append(f"{d.size_bytes:>10} {tok:>5}  {_fit(d.text, 58):<58} {ratio:>6} {p:>8}")
        if d.outcome in (NOT_EXPRESSIBLE, REFUSED):
            lines += wrap(f"why: {w.why}")
        for c in d.passed_over:
            lines += wrap(f"passed over: {c.config} (ratio {c.ratio:.3f}, p = {c.p:.2g}): {c.outcome}: {c.why}")
    lines.append("")
    for n in res.notes:
        lines += textwrap.wrap(f"note: {n}", 100, subsequent_indent="  ")
    if res.rules:
        lines += ["", f"rules ({len(res.rules)}, mode={RULE_MODE}):"] + [f"  {r.to_line()}" for r in res.rules]
        lines += ["", f"written: {out}" if out is not None else "not written: --out FILE writes the rules file"]
    else:
        lines += ["", res.summary + (": no file written" if out is not None else "")]
    return "\n".join(lines)
