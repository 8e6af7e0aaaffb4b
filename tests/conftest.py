"""Shared test helpers: tiny real sweeps (gloo, torchrun) written into temporary folders."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import shutil

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

# The suite starts hundreds of Python processes (the CLI, launch servers, workers, probes).  Where
# PYTHONDONTWRITEBYTECODE is set (it is on this project's machines), each of them compiled commdiag
# from source; with it unset, the first one writes the bytecode and the rest read it.  Tests about
# bytecode set what they need in their own children's environment.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def write_spec(path: Path, **overrides) -> Path:
    """A small gloo spec (2 ranks, 2 sizes, few iterations) with ``overrides`` applied."""
    spec = {
        "name": "t", "backend": "gloo", "nproc_per_node": 2, "dtype": "float32",
        "sizes": {"bytes": [4096, 65536]}, "trials": 1, "warmup": 2, "iters": 5, "timeout_s": 60,
    }
    spec.update(overrides)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_cli(*args, env=None, timeout=600, cwd=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True,
                          text=True, env=full_env, timeout=timeout, cwd=cwd)


def assert_fits(proc: subprocess.CompletedProcess, width: int = 100, stdout: bool = True) -> None:
    """Every line the CLI printed fits ``width`` columns; a single word longer than that (a path)
    may stand alone on its line.  ``stdout=False`` for --json output (JSON is never wrapped)."""
    for name, text in (("stdout", proc.stdout if stdout else ""), ("stderr", proc.stderr)):
        long = [l for l in text.splitlines() if len(l) > width and " " in l.strip()]
        assert not long, f"{name}: {len(long)} line(s) over {width} columns: {long[:3]}"


def one_message(text: str) -> str:
    """The one message a command printed (an error, usually), as a single line of words.  Lines longer
    than 100 columns are wrapped (commdiag/linewrap.py) with their continuation lines indented under
    the first: this checks that every line after the first is such a continuation, not a second
    message, and returns the words joined by single spaces (compare with ``words(expected)``)."""
    first, *rest = text.rstrip("\n").split("\n")
    assert first and not first.startswith(" ") and all(l.startswith("    ") for l in rest), text
    return words(text)


def words(text: str) -> str:
    """``text`` with every run of white space one space: how a wrapped message compares."""
    return " ".join(str(text).split())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def spec_file(tmp_path):
    return lambda **kw: write_spec(tmp_path / "spec.yaml", **kw)


def _gpu_count() -> int:
    """CUDA GPUs visible to this test process (0 without torch or CUDA); read once."""
    global _GPUS
    if _GPUS is None and not any(os.path.exists(p) for p in GPU_SIGNS):
        _GPUS = 0  # no GPU driver of any kind here: no GPU, known without importing torch (4 s of CPU)
    if _GPUS is None:
        try:
            import torch

            _GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001 - no usable torch means no GPU for these tests
            _GPUS = 0
    return _GPUS


_GPUS = None
# Where a GPU driver shows itself: NVIDIA's kernel module, WSL2's GPU device, ROCm's.  With none of
# them torch cannot see a GPU either; with any, torch is asked.
GPU_SIGNS = ("/proc/driver/nvidia/gpus", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


# The longest tests, longest first (from a --durations profile with -n 2 on 2 cores, 2026-12-02): each
# is a real torchrun sweep, a real venv or a real Chromium.  They run first, so that neither xdist worker
# ends the suite alone on one of them while the other idles; with --maxschedchunk 1 (pyproject.toml)
# each worker takes the next test when it is ready for it, so the rest, all short, fill in behind them.
# A node id containing one of these strings; every other test keeps its place, after these.
LONGEST_FIRST = (
    "test_confirm.py::test_real_cpu_aa_through_both_stages",
    "test_tuner_rules.py::test_real_gloo_sweep_with_certify_sizes",
    "test_sweep.py::test_interrupt_then_resume",
    "test_sweep.py::test_reuse_process_runs_per_communicator_settings",
    "test_sweep.py::test_second_sweep_in_a_folder",
    "test_sweep.py::test_smoke_sweep",
    "test_sweep.py::test_hang_crash_and_wrong_launches",
    "test_widths.py::test_cpu_smoke_end_to_end",
    "test_sweep.py::test_reuse_process",
    "test_sweep.py::test_two_torchrun_agents",
    "test_step.py::test_real_cpu_step",
    "test_sweep.py::test_teardown_hang",
    "test_report.py::test_large_report_stays_lean",
    "test_forkserver.py::test_kill_9_of_a_server_mid_launch",
    "test_ab_machine.py::test_throttling_and_another_process",
    "test_compare.py::test_two_recorded_aa_runs_through_the_cli",
    "test_sweep.py::test_a_sweep_started_with_sigint_ignored",
    "test_report.py::test_report_of_a_real_cpu_run_draws_every_plot",
    "test_newcomer.py::test_readme_install_then",
    "test_gpu_recordings.py::test_certified_gpu_report_draws_in_chromium",
    "test_p2p_analysis.py::test_html_page_draws_every_heatmap_in_a_browser",
    "test_report.py::test_report_of_a_real_run_with_crashed",
    "test_ab.py::",
    "test_sweep.py::",
    "test_gpu_recordings.py::",
    "test_report.py::",
    "test_compare.py::",
    "test_newcomer.py::test_doctor_and_detect_text_fits_100_columns",
    "test_safety_owner.py::test_a_venv_owned_by_another_user",
    "test_install_tuner.py::test_install_status_reinstall_and_exact_undo",
    "test_widths.py::test_detect_and_doctor_on_gpu_recordings",
    "test_safety_children.py::test_a_sweep_launch_agent_and_worker",
    "test_envcheck.py::test_propagation_through_every_start_method",
    "test_install_tuner.py::",
    "test_hook.py::test_spawn_child_and_status",
    "test_widths.py::",
)


# The long real end-to-end runs, marked ``slow`` here in one place: torchrun sweeps through several
# stages or many launches, each tens of seconds to minutes on 2 cores.  The README's command leaves them
# out (addopts: -m "not slow"); `pytest -m slow` runs them, and CI runs that as a step of its own
# (.ci/run).  What each proves is listed in docs/testing.md.  A node id containing one of these strings.
SLOW = (
    "test_confirm.py::test_real_cpu_aa_through_both_stages",
    "test_tuner_rules.py::test_real_gloo_sweep_with_certify_sizes",
    "test_step.py::test_real_cpu_step",
    # test_sweep.py's real fault sweeps, 10-60 s each with -n 2 on 2 cores (they wait on their deadlines
    # whatever the launch method), and two 8-s sweeps (cpu-smoke's widths, reuse_process).  The smoke
    # sweep came back to the README's set once a forkserver sweep took seconds (7 s, 2026-12-02).
    "test_widths.py::test_cpu_smoke_end_to_end",
    "test_sweep.py::test_reuse_process_runs_per_communicator_settings",
    "test_sweep.py::test_interrupt_then_resume",
    "test_sweep.py::test_second_sweep_in_a_folder",
    "test_sweep.py::test_hang_crash_and_wrong_launches",
    "test_sweep.py::test_reuse_process_keeps_finished_runs",
    "test_sweep.py::test_two_torchrun_agents",
    "test_sweep.py::test_teardown_hang",
    "test_sweep.py::test_a_sweep_started_with_sigint_ignored_can_still_be_interrupted",
    # fault paths of real process trees (20-40 s each on 2 cores): a dirty launch server falling back to
    # torchrun, and ab killed with SIGKILL mid-launch; test_forkserver's server-kill test stays in the
    # README's set as the fork server's own fault test
    "test_forkserver.py::test_a_server_that_is_not_clean_refuses",
    "test_ab.py::test_kill_9_mid_launch_then_resume",
    # four sweeps (two per launch method) for one ratio: the CI check of the fork server's CPU benchmark
    "test_forkserver.py::test_forkserver_sweep_takes_at_most_70_percent_of_torchrun_time",
    # #28's end-to-end check under the default launch (forkserver): two sweeps (the issue's spec, its A/A),
    # 40 launches of 200 iterations and four groups of launch servers (an import of torch per rank each),
    # 2-3 minutes on 2 cores
    "test_import_env.py::test_the_spec_of_issue_28_is_certified_under_the_default_launch_and_its_a_a_is_not",
    # two groups of real launch servers (two imports of torch, 10-50 s on 2 cores); the keying itself is
    # tested without processes in the README's set (test_pool_keys_groups_by_what_their_servers_proved_read)
    "test_import_env.py::test_a_pool_shares_servers_across_nccl_settings_and_starts_new_ones_for_anything_else",
    # a 50-config x 20-size report drawn in chromium (about 30 s of CPU)
    "test_report.py::test_large_report_stays_lean",
    # a real 2-launch sweep (7-9 s) for one equivalence: run_sweep() from Python publishes what the CLI
    # does (every CLI sweep test in the README's set already publishes through the library)
    "test_run_folder_engine.py::test_run_sweep_from_python_publishes",
    # issue 37's Wilson-bound simulations that need the whole claim function per run (400-600 runs of
    # certify.test_claim or ab's judge, 3-5 s each); their literal companions stay in the README's set
    "test_familywise.py::test_a_first_run_in_a_process_effect_never_certifies_a_twin",
    "test_familywise.py::test_a_config_whose_slow_launches_time_out_is_not_certified_faster",
    "test_familywise.py::test_an_ab_arm_that_fails_often_is_not_certified_equivalent",
    "test_familywise.py::test_a_metric_coarser_than_a_third_of_min_effect_gets_no_verdict",
    # the real Slurm cluster (tests/cluster/slurm-2node.sh up 3): every launch an srun step importing
    # torch on each node, 1-4 min a test; and the slow-node check's A/A simulation (6 noise models x
    # 300 fleets x 2000 permutation draws, about 10 s a model)
    "test_multinode.py::",
    # torchrun across hosts through node_command on the same cluster's namespaces (no Slurm): a sweep
    # of two launches, a hung one waiting out its 90-s deadline, Ctrl-C and resume (1-3 min each, an
    # import of torch per host and launch), and the CLI's errors for a node_command that cannot start
    # or cannot run commdiag (a CLI start each, 4 s)
    "test_multinode_hosts.py::test_a_sweep_across_two_hosts_through_node_command",
    "test_multinode_hosts.py::test_a_hung_rank_on_host_two_is_killed_at_the_deadline",
    "test_multinode_hosts.py::test_ctrl_c_leaves_nothing_on_any_host_and_resume_finishes",
    "test_multinode_hosts.py::test_a_node_command_that_cannot_start_is_one_clear_error",
    "test_multinode_hosts.py::test_a_host_that_cannot_run_commdiag_is_one_clear_error_before_any_launch",
    "test_nodeverdict.py::test_an_aa_fleet_names_nobody",
)


def longest_first_rank(nodeid: str) -> int:
    """The place of ``nodeid`` in LONGEST_FIRST (len(LONGEST_FIRST) for every other test)."""
    return next((n for n, part in enumerate(LONGEST_FIRST) if part in nodeid), len(LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker: the slow marks are added here
def pytest_collection_modifyitems(config, items):
    """The longest tests first (LONGEST_FIRST; a stable sort: the same order in every xdist worker, as
    xdist requires), the SLOW ones marked ``slow``, and tests marked ``gpu`` run where a GPU is visible
    and skip, saying so, where none is."""
    items.sort(key=lambda item: longest_first_rank(item.nodeid))
    slow = 0
    for item in items:
        if any(part in item.nodeid for part in SLOW):
            item.add_marker(pytest.mark.slow)
            slow += 1
    config.stash[SLOW_COLLECTED] = slow
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and _gpu_count() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
        for item in gpu_items:
            item.add_marker(skip)


# How many collected tests are slow: counted where the tests are collected (each xdist worker collects
# all of them), handed to the controller through xdist's workeroutput, and printed in its summary.
SLOW_COLLECTED = pytest.StashKey[int]()


def pytest_testnodedown(node, error):
    """xdist's controller: a worker's count of collected slow tests (every worker collects the same)."""
    count = getattr(node, "workeroutput", {}).get("slow_collected")
    if count is not None:
        node.config.stash[SLOW_COLLECTED] = max(count, node.config.stash.get(SLOW_COLLECTED, 0))


def pytest_sessionfinish(session, exitstatus):
    """End this process's Chromium (tests/browser.py), if a test started one: an xdist worker may
    leave without running atexit handlers.  A worker hands its count of slow tests to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["slow_collected"] = session.config.stash.get(SLOW_COLLECTED, 0)
    browser = sys.modules.get("browser")
    if browser is not None:
        browser.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One visible line when the slow tests were left out (the README's command), and one when the
    browser the report tests need is missing (they skip without it)."""
    if "not slow" in (config.option.markexpr or ""):
        slow = config.stash.get(SLOW_COLLECTED, 0)
        terminalreporter.write_line(
            f"NOTE: {slow} slow test{'' if slow == 1 else 's'} left out (tests/conftest.py SLOW); "
            "`pytest -m slow` runs them", yellow=True, bold=True)
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        terminalreporter.write_line(
            "NOTE: no chromium: the HTML report tests skipped (apt-get install chromium)",
            yellow=True, bold=True)
