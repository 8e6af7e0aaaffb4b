"""Compare NCCL's ENV and INIT lines of two launches (a torchrun one and a forked one).

    python3 benchmarks/compare_nccl_logs.py DIR_A DIR_B [NAME=VALUE ...]

Reads every ``nccl.*.log`` (NCCL_DEBUG_FILE) in each folder.  ENV lines ("NCCL_X set by environment
to V") must be the same set in both, and each NAME=VALUE given must be among them in both
(NCCL_PROTO and NCCL_ALGO may be absent from both: with one rank NCCL skips its tuning model).  INIT lines are
compared as multisets after masking what differs between any two processes: addresses and ids (hex),
timings (decimals), the launch folder's path, the host:pid:tid prefix, and the CPU core NCCL's proxy
threads landed on (two torchrun launches of one config differed there too: cores 3/4/5/9 and 2/3/0/8
on 1x H200).  Lines NCCL prints only when its process exits (EXIT_ONLY) are listed, not compared: a
forked child ends with os._exit once its results are written, so NCCL's exit-time cleanup does not
run there (nothing it measured depends on it).  Exit 0 when both match.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commdiag.nccl.ncclog import _PREFIX, _SET, _value  # noqa: E402

TUNING_VARS = ("NCCL_PROTO", "NCCL_ALGO")  # read by NCCL's tuning model only, which one rank skips
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_DEC = re.compile(r"\d+\.\d+")
_PID = re.compile(r"\bpid \d+")
_CORE = re.compile(r"CPU core \d+")
EXIT_ONLY = ("ENV/Plugin: Closing env plugin",)  # printed at process exit (library teardown), not at init


def lines_of(folder: Path) -> tuple[set[str], Counter, Counter]:
    env: set[str] = set()
    init: Counter = Counter()
    at_exit: Counter = Counter()
    for log in sorted(folder.glob("nccl.*.log")):
        for raw in log.read_text(errors="replace").splitlines():
            m = _PREFIX.match(raw.strip())
            if not m:
                continue
            msg = m["msg"].replace(str(folder.resolve()), "<folder>")
            if _SET.match(msg):
                env.add(msg)
            elif msg.startswith(EXIT_ONLY):
                at_exit[msg] += 1
            else:
                init[_CORE.sub("CPU core <n>", _PID.sub("pid <pid>", _DEC.sub("<t>", _HEX.sub("<hex>", msg))))] += 1
    return env, init, at_exit


def compare(a: Path, b: Path, want: dict[str, str], out_json: Path | None = None) -> int:
    env_a, init_a, exit_a = lines_of(a)
    env_b, init_b, exit_b = lines_of(b)
    applied_a = {s["name"]: _value(s["value"]) for s in map(_SET.match, env_a)}
    applied_b = {s["name"]: _value(s["value"]) for s in map(_SET.match, env_b)}
    # With one rank NCCL skips its tuning model and logs no NCCL_PROTO/NCCL_ALGO (seen on 1x H200): a
    # variable absent from both logs is listed as unlogged; one logged with another value, or in only
    # one of the two, fails.
    unlogged = sorted(k for k in want if k in TUNING_VARS and k not in applied_a and k not in applied_b)
    missing = {k: v for k, v in want.items() if k not in unlogged and (applied_a.get(k) != v or applied_b.get(k) != v)}
    only_a, only_b = init_a - init_b, init_b - init_a
    ok = bool(env_a) and env_a == env_b and not missing and not only_a and not only_b
    report = {"a": str(a), "b": str(b), "env_lines_a": sorted(env_a), "env_lines_b": sorted(env_b),
              "env_equal": env_a == env_b, "wanted_missing": missing, "wanted_unlogged": unlogged, "init_lines": sum(init_a.values()),
              "init_only_a": sorted(only_a.elements()), "init_only_b": sorted(only_b.elements()),
              "exit_lines_a": sorted(exit_a.elements()), "exit_lines_b": sorted(exit_b.elements()), "equal": ok}
    print(f"ENV lines: {len(env_a)} in {a.name}, {len(env_b)} in {b.name}: "
          + ("identical" if env_a == env_b else "DIFFERENT"))
    for line in sorted(env_a | env_b):
        print(f"  {'=' if line in env_a and line in env_b else ('A' if line in env_a else 'B')} {line}")
    print("config variables applied in both: " + ("all logged" if not missing else f"MISSING {missing}")
          + (f"; logged by neither: {', '.join(unlogged)} (with one rank NCCL skips its tuning model)"
             if unlogged else ""))
    print(f"INIT lines (masked): {sum(init_a.values())} vs {sum(init_b.values())}: "
          + ("identical" if not only_a and not only_b else "DIFFERENT"))
    for line in sorted(only_a.elements()):
        print(f"  only {a.name}: {line}")
    for line in sorted(only_b.elements()):
        print(f"  only {b.name}: {line}")
    if exit_a or exit_b:
        print(f"exit-time lines (not compared): {a.name} {sum(exit_a.values())}, {b.name} {sum(exit_b.values())}"
              + "".join(f"\n  {name}: {line}" for name, c in ((a.name, exit_a), (b.name, exit_b)) for line in c))
    print("PROOF 1: " + ("PASS" if ok else "FAIL"))
    if out_json:
        out_json.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    want = dict(arg.split("=", 1) for arg in sys.argv[3:])
    sys.exit(compare(Path(sys.argv[1]), Path(sys.argv[2]), want))
