"""Launches across named hosts outside Slurm: one torchrun agent per host, through the user's command.

A spec with ``launch: torchrun``, ``hosts: [node1, node2]`` and ``node_command: [ssh, "{host}"]``
(or ``[pdsh, -w, "{host}"]``, ``[docker, exec, "{host}", sh, -c]``, ...) runs commdiag once; each
launch starts, for host ``i``, ``node_command`` with ``{host}``/``{index}`` filled in and one more
argument: a POSIX shell command line (ssh hands its arguments to the remote shell)::

    cd -- LAUNCH_FOLDER && exec env -i NAME=VALUE ... PYTHON -P -m torch.distributed.run
        --nnodes=N --node-rank=i --master-addr=FIRST_HOST --master-port=PORT ... worker --plan ...

Every value is quoted with ``shlex``.  ``env -i`` + the launch's whole environment (the user's,
the config's, commdiag's marker ``COMMDIAG_LAUNCH_ID``): every agent on every host gets exactly what
commdiag chose, as ``srun --export=ALL`` does under Slurm, not whatever the remote login shell sets.

Why torchrun's static rendezvous (``--node-rank``, ``--master-addr``) and not c10d: c10d assigns the
node ranks itself, sorted by each agent's FQDN (torch's dynamic_rendezvous), ignoring
``--node-rank``, and hosts its store on whichever agent's host name matches the endpoint; with the
static one host ``i`` runs ranks ``i*nproc .. i*nproc+nproc-1`` and node 0 always hosts the store,
so run.json's host of each rank is the one the spec named.  ``MASTER_PORT`` is drawn per launch
(``rdzv_endpoint``, if set, is every launch's address instead).

The deadline is commdiag's: past it (or when one host's agent fails, or Ctrl-C) every local
``node_command`` group is stopped (SIGTERM, a grace, SIGKILL); ssh ending does not end what it
started on the other side, so a reaper runs through the same ``node_command`` on every host
(``python -m commdiag.measure.hosts --reap MARKER``: kills what carries the marker there).
The run folder must be on a path every host sees (each node's first rank writes result.json there).
docs/multinode.md, "Without Slurm".
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import sys
import time
from pathlib import Path

from .. import PACKAGE_PARENT, procs
from ..childpython import module_argv
from ..errors import CommdiagError
from . import launcher

PORT_RANGE = (20000, 32000)  # as slurm.PORT_RANGE: drawn, not probed (the port is bound on host 0)
REAP_DEADLINE_S = 60.0  # the reaper through node_command: one short python per host (ssh connects)
POLL_S = 0.05
SUMMARY_LOG = "torchrun.log"  # what commdiag saw of each agent; each agent's own output: AGENT_LOG


def agent_log(index: int) -> str:
    return f"torchrun.node{index}.log"


def node_argv(node_command, host: str, index: int, line: str) -> list[str]:
    """The user's command for one host, placeholders filled in, the shell command line appended."""
    return [arg.format(host=host, index=index) for arg in node_command] + [line]


def rdzv_host(host: str) -> str:
    """The address of ``host`` for the other agents: ssh's ``user@`` taken off."""
    return host.rpartition("@")[2]


# What says where a shell is, not what a launch is: this host's values would be wrong on another one.
HERE_ONLY = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME"})


def shell_line(argv: list[str], env: dict[str, str], cwd: str) -> str:
    """``cd -- CWD && exec env -i NAME=VALUE ... ARGV``, every word quoted for a POSIX shell."""
    assigns = [f"{k}={v}" for k, v in sorted(env.items())
               if k and "=" not in k and not k.startswith("-") and k not in HERE_ONLY]
    return f"cd -- {shlex.quote(cwd)} && exec env -i {shlex.join(assigns + list(argv))}"


def agent_argv(nproc: int, nnodes: int, node_rank: int, master: tuple[str, int], deadline_s: float,
               plan_path: Path) -> list[str]:
    """One host's torchrun agent (static rendezvous: module docstring), its workers as launcher's."""
    args = [f"--nproc-per-node={nproc}", "--max-restarts=0", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
            f"--master-addr={master[0]}", f"--master-port={master[1]}", f"--rdzv-conf=timeout={int(deadline_s)}"]
    worker = module_argv("commdiag.measure.worker", ["--plan", str(plan_path)])
    return module_argv("torch.distributed.run", [*args, "--no-python", worker[0], "-u", *worker[1:]])


def master_of(hosts, rdzv_endpoint: str | None) -> tuple[str, int]:
    if rdzv_endpoint:
        host, _, port = rdzv_endpoint.rpartition(":")
        return host, int(port)
    return rdzv_host(hosts[0]), random.SystemRandom().randrange(*PORT_RANGE)


def local_env(base_env: dict[str, str]) -> dict[str, str]:
    """What node_command itself runs with here: the user's environment (ssh's agent socket, HOME,
    PATH), never a config's variables (a config's LD_PRELOAD is for the workers, not for ssh)."""
    return {k: v for k, v in base_env.items() if k != procs.MARKER}


def launch_worker(folder: Path, plan: dict, *, hosts, node_command, base_env: dict[str, str],
                  config_env: dict[str, str], extra_env: dict[str, str], nproc: int, nnodes: int,
                  rdzv_endpoint: str | None, deadline_s: float, marker: str) -> launcher.LaunchOutcome:
    """Write ``plan.json`` and run one torchrun agent per host; nothing of the launch survives."""
    from ..atomic import write_json

    folder = Path(os.path.abspath(folder))
    write_json(folder / "plan.json", plan)
    env = launcher.launch_env(base_env, config_env, {**extra_env, launcher.MARKER: marker})
    master = master_of(hosts, rdzv_endpoint)
    argvs = [node_argv(node_command, host, i, shell_line(
        agent_argv(nproc, nnodes, i, master, deadline_s, folder / "plan.json"), env, str(folder)))
        for i, host in enumerate(hosts[:nnodes])]
    return run_agents(argvs, hosts[:nnodes], local_env(base_env), folder, deadline_s, marker, node_command,
                      master)


def run_agents(argvs, hosts, env: dict[str, str], folder: Path, deadline_s: float, marker: str,
               node_command, master) -> launcher.LaunchOutcome:
    """Start every host's command, wait for all to exit 0, the first failure, the deadline or Ctrl-C;
    then stop every group, reap on every host, and write what each did to ``torchrun.log``."""
    groups: list[procs.Group] = []
    codes: list[int | None] = []
    timed_out = interrupted = False
    first_failed = None
    t0 = time.monotonic()
    try:
        for i, argv in enumerate(argvs):
            try:  # no parent-death signal: after a kill -9 of commdiag, --resume reaps by marker
                groups.append(procs.start(argv, env=env, cwd=folder, marker=marker, stdout=folder / agent_log(i),
                                          stderr=procs.STDOUT, parent_death=None))
            except OSError as e:
                raise CommdiagError(f"node_command for host {hosts[i]} (node {i}) did not start: "
                                    f"{argv[0]}: {e.strerror or e}") from None
        while True:
            codes = [g.poll() for g in groups]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                first_failed = failed[0]
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - t0 > deadline_s:
                timed_out = True
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stopped = _stop_all(groups)
        survivors = reap(hosts, node_command, marker, env) if groups else 0
        survivors += procs.kill_marked(marker, procs.KILL_GRACE_S)  # what runs here (commdiag's host is one)
        codes = [g.returncode for g in groups]
        for g in groups:
            g.close()
    wall = time.monotonic() - t0
    _summary(folder, hosts, codes, stopped, first_failed, timed_out, interrupted, master, wall)
    done = not (timed_out or interrupted)
    if first_failed is not None:
        exit_code = codes[first_failed]
    elif done and all(c == 0 for c in codes):
        exit_code = 0
    else:
        exit_code = None
    return launcher.LaunchOutcome(exit_code if done else None, timed_out, wall, survivors, interrupted)


def _stop_all(groups: list[procs.Group]) -> list[str | None]:
    """SIGTERM to every group at once, then each one's ladder (SIGKILL last); a second Ctrl-C kills."""
    running = [g.poll() is None for g in groups]
    for g, alive in zip(groups, running):
        if alive:
            g.signal_group(signal.SIGTERM)
    how = []
    for g, alive in zip(groups, running):
        try:
            ended = g.stop(((signal.SIGTERM, procs.KILL_GRACE_S),), sweep=False).signal
        except KeyboardInterrupt:
            ended = g.stop((), sweep=False).signal
        how.append(ended or ("SIGTERM" if alive else None))  # it may have exited on the first SIGTERM
    return how


def _summary(folder, hosts, codes, stopped, first_failed, timed_out, interrupted, master, wall) -> None:
    lines = [f"commdiag: {len(hosts)} torchrun agent(s) through node_command, rendezvous {master[0]}:{master[1]}, "
             f"{wall:.1f} s"]
    for i, host in enumerate(hosts):
        code = codes[i] if i < len(codes) else None
        how = stopped[i] if i < len(stopped) else None
        what = ("did not start" if i >= len(codes) else
                f"stopped by commdiag ({how}; exit {code})" if how else f"exit {code}")
        lines.append(f"node {i} host {host}: {what}{' -- ended the launch' if i == first_failed else ''}"
                     f" (log {agent_log(i)})")
    if timed_out:
        lines.append("the launch's deadline (timeout_s) passed: every agent was stopped")
    if interrupted:
        lines.append("interrupted (Ctrl-C): every agent was stopped")
    with open(folder / SUMMARY_LOG, "a") as f:
        f.write("\n".join(lines) + "\n")


def reap_line(marker: str) -> str:
    """The reaper's command line on a host: its environment does not carry the marker (it is an
    argument), so it never counts or kills itself."""
    argv = module_argv("commdiag.measure.hosts", ["--reap", marker])
    return shell_line(argv, {"PYTHONPATH": PACKAGE_PARENT}, "/")


def reap(hosts, node_command, marker: str, env: dict[str, str]) -> int:
    """On every host at once, kill what still carries ``marker``; how many were found in all."""
    env = local_env(env)
    started = []
    for i, host in enumerate(hosts):
        try:
            started.append(procs.start(node_argv(node_command, host, i, reap_line(marker)), env=env, cwd="/",
                                       stdout=procs.PIPE, stderr=procs.PIPE))
        except OSError:
            continue
    found = 0
    for group in started:
        end = procs.finish(group, deadline_s=REAP_DEADLINE_S)
        found += sum(int(w.split("=", 1)[1]) for w in end.stdout.decode(errors="replace").split()
                     if w.startswith("reaped=") and w.split("=", 1)[1].isdigit())
    return found


METHOD_TEXT = ("each launch is one fresh torchrun agent per host (static rendezvous, node rank = the host's "
               "place in hosts), started through the spec's node_command with the launch's whole environment "
               "(env -i NAME=VALUE ...)")


def record(spec) -> dict:
    """run.json's ``launch.hosts``: where the agents ran and how they were started."""
    return {"hosts": list(spec.hosts[:spec.nnodes]), "node_command": list(spec.node_command),
            "rendezvous": spec.rdzv_endpoint or f"{rdzv_host(spec.hosts[0])}:<a fresh port per launch>",
            "node_ranks": "host i runs ranks i*nproc_per_node .. (i+1)*nproc_per_node-1"}


def preflight(spec) -> int:
    """Before any work: node_command's program is here, and the ranks per node are known (the GPUs
    are on the hosts: nccl needs nproc_per_node)."""
    program = spec.node_command[0].format(host=spec.hosts[0], index=0)
    if not (procs.which(program) if os.sep not in program else os.access(program, os.X_OK)):
        raise CommdiagError(f"{spec.path}: node_command[0]: program {program!r} is not found on PATH (or not "
                            "executable): node_command is how commdiag reaches each host, e.g. [ssh, \"{host}\"]")
    nproc = spec.nproc_per_node
    if nproc is None:
        raise CommdiagError(f"{spec.path}: nproc_per_node: required with hosts (the GPUs are on the hosts, "
                            "not counted here): set it to the ranks per host")
    if nproc * spec.nnodes < 2:
        raise CommdiagError(f"{spec.path}: nproc_per_node: an all-reduce needs at least 2 ranks in all "
                            f"(got {nproc} x {spec.nnodes} node(s))")
    return nproc


CHECK_DEADLINE_S = 60.0  # one short python per host, at once (an ssh connection each)


def check_line(run_dir: Path) -> str:
    """On a host: the run folder is there (the same one: its run.json), and this Python imports this
    commdiag; prints the host's own name."""
    where = shlex.quote(str(run_dir))
    not_here = shlex.quote(f"commdiag: the run folder {run_dir} (with its run.json) is not seen on this host: "
                           "the run folder must be on a path every host sees (--out /shared/...)")
    argv = module_argv("commdiag.measure.hosts", ["--check"])
    return (f"{{ cd -- {where} && [ -f run.json ]; }} 2>/dev/null || {{ echo {not_here} >&2; exit 97; }}; "
            f"exec env -i {shlex.join([f'PYTHONPATH={PACKAGE_PARENT}', *argv])}")


def check(spec, run_dir: Path, base_env: dict[str, str]) -> list[dict]:
    """Before the first launch: node_command reaches every host, each sees the run folder and runs this
    Python with commdiag; one clear error naming the host otherwise (not one failed launch per config).
    Returns each host's own name (run.json ``launch.hosts.checked``)."""
    env = local_env(base_env)
    targets = list(enumerate(spec.hosts[:spec.nnodes]))
    started = []
    for i, host in targets:
        argv = node_argv(spec.node_command, host, i, check_line(Path(os.path.abspath(run_dir))))
        try:
            started.append(procs.start(argv, env=env, cwd="/", stdout=procs.PIPE, stderr=procs.PIPE))
        except OSError as e:
            raise CommdiagError(f"{spec.path}: node_command for host {host} (node {i}) did not start: "
                                f"{argv[0]}: {e.strerror or e}") from None
    answers, problems = [], []
    for (i, host), group in zip(targets, started):
        end = procs.finish(group, deadline_s=CHECK_DEADLINE_S)
        out = end.stdout.decode(errors="replace")
        name = next((w.split("=", 1)[1] for w in out.split() if w.startswith("commdiag-host=")), None)
        if end.exit_code == 0 and name:
            answers.append({"host": host, "index": i, "hostname": name})
            continue
        said = (end.stderr.decode(errors="replace").strip() or out.strip())[-400:]
        how = (f"no answer within {CHECK_DEADLINE_S:g} s" if end.timed_out else f"exit {end.exit_code}")
        problems.append(f"host {host} (node {i}): {how}" + (f": {said}" if said else ""))
    if problems:
        shown = shlex.join(node_argv(spec.node_command, spec.hosts[0], 0, "COMMAND-LINE"))
        raise CommdiagError(f"{spec.path}: node_command could not run commdiag's check on every host "
                            f"({shown}): " + "; ".join(problems) + ". Each host needs the same Python, with "
                            "commdiag and torch, at the same path, and the run folder on a path it sees "
                            "(docs/multinode.md)")
    return answers


def reap_pending(run: dict, env: dict[str, str]) -> int:
    """Before a resume reruns a launch: end, on every host, what a killed commdiag left of its pending
    launches (by marker)."""
    spec = run["spec"]
    hosts = spec["hosts"][:spec.get("nnodes", 1)]
    found = 0
    for marker in sorted({l.get("marker") for l in run["launches"] if l.get("status") == "pending"} - {None, ""}):
        found += reap(hosts, spec["node_command"], marker, env)
    return found


def main(argv: list[str]) -> int:
    """``python -m commdiag.measure.hosts --reap MARKER``: the reaper on one host; ``--check``: the
    check before a run's first launch."""
    if len(argv) == 2 and argv[0] == "--reap":
        print(f"reaped={launcher.kill_marked(argv[1], procs.KILL_GRACE_S)}", flush=True)
        return 0
    if argv == ["--check"]:  # check_line: this host runs this commdiag; its own name
        import socket

        print(f"commdiag-host={socket.gethostname()} python={sys.version.split()[0]}", flush=True)
        return 0
    print("usage: python -m commdiag.measure.hosts --reap MARKER | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
