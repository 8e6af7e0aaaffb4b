"""The newcomer's path: the README leads, the worker check works from any folder, output fits.

Real CLI subprocesses; the README is read as a file, so a command it shows is the command tested.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli

README = (REPO / "README.md").read_text()
WORKFLOW = ["doctor", "sweep", "confirm", "report", "compare", "explain", "install-hook", "check-env", "detect"]


def clean_env(**extra) -> dict:
    """This environment without NCCL_* (the test must not depend on the shell that ran pytest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(extra)
    return env


def cli(*args, env, cwd=None):
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=300, cwd=cwd)


# --------------------------------------------------------------------------- the README


def test_readme_first_screen_says_what_it_is_then_cpu_then_the_gpu_path():
    lines = README.splitlines()
    heads = [n for n, l in enumerate(lines) if l.startswith("## ")]
    # a paragraph of prose before any command; the two CPU commands; the GPU path within the first screens
    assert lines[2].startswith("commdiag tells you whether NCCL settings")
    assert lines[heads[0]] == "## Try it on a CPU machine" and lines[heads[1]] == "## On your GPU box"
    assert heads[1] < 40
    cpu = README.split("## Try it on a CPU machine", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert cpu.splitlines()[1] in ci  # CI runs the README's test command verbatim


def test_readme_gpu_path_installs_against_the_torch_already_there():
    gpu = README.split("## On your GPU box", 1)[1].split("## Commands", 1)[0]
    # a regular install (not -e): an editable one is an empty package in a server started beside the clone
    assert "python3 -m venv --system-site-packages .venv && .venv/bin/pip install ." in gpu
    assert "`python3 -m pip install .`" in gpu  # torch in a venv: into that venv
    assert not re.search(r"`[^`]*pip install -e \S[^`]*`", gpu.split("**2. Check the machine", 1)[0])
    assert "torch==" not in gpu  # no torch pin on a GPU box
    order = ["commdiag doctor", "commdiag sweep sweeps/nvlink2-aa.yaml", "commdiag sweep sweeps/pcie8.yaml",
             "commdiag report reports/<run>", "install-hook --from reports/<run>", "commdiag.check_env("]
    at = [gpu.index(s) for s in order]
    assert at == sorted(at), order


def test_readme_gives_a_time_for_every_shipped_spec_and_the_tests():
    table = README.split("## Shipped specs and how long they take", 1)[1].split("\n## ", 1)[0]
    for spec in sorted(p.name for p in (REPO / "sweeps").glob("*.yaml")):
        row = next((l for l in table.splitlines() if l.startswith(f"| `{spec}`")), None)
        assert row is not None, spec
        assert re.search(r"\d+(\.\d+)? (s|min|minute)", row.rsplit("|", 2)[1]), row
    tests = README.split("## Tests", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"\d+ min", tests) and "SUITE_TIME" not in tests


def test_readme_cpu_lines_take_torch_from_pytorchs_cpu_index():
    cpu = README.split("## Try it on a CPU machine", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = cpu.splitlines()
    assert len(lines) == 2
    for line in lines:  # an extra index: the CPU wheel from PyTorch's, everything else from the public one
        # no retries: where that index is unreachable (offline, blocked) pip skips it at once, no minutes
        # of retry warnings; CI runs the second line verbatim, so it is what CI's offline machine does
        assert ("PIP_RETRIES=0 .venv/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu "
                "torch==2.13.0 ") in line
        assert "--index-url" not in line.replace("--extra-index-url", "")
    ci = (REPO / ".ci" / "run").read_text()
    assert lines[1] in ci and "export PIP_RETRIES" not in ci


def test_readme_links_every_docs_page_and_each_page_exists():
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert {"glossary.md", "verdicts.md", "method.md", "formats.md", "fidelity.md", "install-hook.md",
            "reuse-process.md", "spec.md"} <= set(pages)
    for page in pages:
        assert f"](docs/{page})" in README, page
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (REPO / target).is_file(), target
    glossary = (REPO / "docs" / "glossary.md").read_text()
    for term in ("TP", "band", "A/A", "family-wise", "exact rank test", "sd of ln time", "LL, LL128, Simple", "NVLS",
                 "CTA", "PIX, PXB, PHB", "pynccl", "busbw", "screening", "confirmation", "claim"):
        assert f"**{term}" in glossary or f", {term}" in glossary or f"{term}**" in glossary, term


def test_the_verdicts_page_keeps_the_method():
    v = (REPO / "docs" / "verdicts.md").read_text()
    for s in ("mean of\nln(time) after dropping the lowest and highest 5%", "Stage 1, screening", "Stage 2, confirmation",
              "exact Wilcoxon signed-rank", "p <= 0.5%/M", "1/2^k", "`--no-confirm`", "screening only"):
        assert s in v, s


def test_spec_docs_tell_the_seed_key_from_the_config_named_seed():
    spec = (REPO / "docs" / "spec.md").read_text()
    assert "## `seed:` (a spec key) is not the config named `seed`" in spec
    assert "--set seed=42" in spec and "--set configs.seed.NCCL_PROTO=Simple" in spec


# --------------------------------------------------------------------------- the worker check


def _installed() -> bool:
    try:
        importlib.metadata.version("commdiag")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed(), reason="needs commdiag installed (pip install -e .) in this interpreter")
def test_readme_worker_check_works_from_the_folder_holding_the_clone(tmp_path):
    # A clone is a folder named commdiag/; from its parent, a plain `python -c "import commdiag"` imports the
    # clone's top folder as an empty namespace package ahead of an editable install. The README's line is -I.
    (tmp_path / "commdiag").symlink_to(REPO, target_is_directory=True)
    line = next(l for l in README.splitlines() if " -I -c 'import commdiag;" in l)
    code = line.split(" -I -c ", 1)[1].strip().strip("'")
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    cp = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                        env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith("commdiag check-env pid ") and "OK" in cp.stdout
    # the same check with an expectation: found missing (exit 1), then arrived (exit 0)
    code = code.replace("check_env()", 'check_env({"NCCL_PROTO": "LL"})')
    cp = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                        timeout=120)
    assert cp.returncode == 1 and "FAIL NCCL_PROTO missing" in cp.stdout, cp.stderr
    cp = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                        env={**env, "NCCL_PROTO": "LL"}, timeout=120)
    assert cp.returncode == 0 and "OK 1 expected" in cp.stdout, cp.stderr


def _purelib(py: str) -> str:
    return subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def _lend_setuptools(py: str, folder: Path) -> bool:
    """Make this interpreter's setuptools (and wheel, if any) importable in the venv of ``py``, through a .pth
    naming a folder of links to them: only those packages, not this interpreter's whole site-packages.
    False where this interpreter has no setuptools either."""
    import importlib.util

    found = importlib.util.find_spec("setuptools")
    if found is None or not found.submodule_search_locations:
        return False
    site = Path(next(iter(found.submodule_search_locations))).parent
    folder.mkdir()
    # with their .dist-info: setuptools finds its own commands (dist_info, bdist_wheel) by entry points
    for name in ("setuptools", "pkg_resources", "_distutils_hack", "wheel"):
        for path in (site / name, *site.glob(f"{name}-*.dist-info")):
            if path.is_dir():
                (folder / path.name).symlink_to(path, target_is_directory=True)
    (Path(_purelib(py)) / "commdiag-test-lent-setuptools.pth").write_text(f"{folder}\n")
    return True


def test_readme_install_then_the_in_server_line_works_from_the_folder_holding_the_clone(tmp_path):
    """Step 1's install into a real venv (the server's), then step 7's in-server line run by that venv's
    python from the clone's parent folder, where the clone is a folder named commdiag/ on the path."""
    gpu = README.split("## On your GPU box", 1)[1].split("## Commands", 1)[0]
    install = re.search(r"`python3 -m pip install ([^`]*)`", gpu).group(1).split()
    line = gpu.split("and inside the server", 1)[1].split("```python\n", 1)[1].split("\n", 1)[0]
    parent = tmp_path / "home"
    clone = parent / "commdiag"  # `git clone ... commdiag && cd commdiag`
    clone.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, clone / name)
    shutil.copytree(REPO / "commdiag", clone / "commdiag", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    venv = tmp_path / "server-venv"
    # without its own pip (ensurepip costs 10 s of CPU here): this interpreter's pip installs into it
    # (`pip --python`: the same pip run by the venv's python, so the venv's site-packages get the package)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in clean_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # --no-deps: the server's venv has its own packages, and check_env needs none of commdiag's; built
    # with this interpreter's setuptools lent to the venv (no index needed; a machine without network
    # cannot reach one), else in pip's isolated build
    local = _lend_setuptools(py, tmp_path / "lent")
    cp = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
                         *(["--no-build-isolation", "--no-index"] if local else []), *install],
                        cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    if cp.returncode and not local and "No matching distribution found for setuptools" in cp.stderr:
        pytest.skip("no setuptools here to build with, and no package index reachable for pip's isolated "
                    "build to fetch one: the README's install cannot be shown on this machine")
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert subprocess.run([py, "-c", "import commdiag"], cwd=tmp_path, env=env, timeout=60).returncode == 0
    for pth in Path(_purelib(py)).glob("commdiag-test-lent-*.pth"):
        pth.unlink()  # the server's venv as it was, plus commdiag
    # `python -c` puts the current folder first on sys.path, as `python -m server ...` does
    cp = subprocess.run([py, "-c", line], cwd=parent, env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and "AttributeError" not in cp.stderr, cp.stderr
    assert cp.stderr.startswith("commdiag check-env pid "), cp.stderr


# --------------------------------------------------------------------------- --help


def test_help_lists_commands_in_workflow_order_with_whole_one_line_descriptions():
    from commdiag.cli import _Group

    cp = run_cli("--help", env={"COLUMNS": "80"})
    assert cp.returncode == 0
    listing = cp.stdout.split("Commands:\n", 1)[1].splitlines()
    rows = [l for l in listing if re.match(r"  \S", l)]
    names = [l.split()[0] for l in rows]
    assert [n for n in names if n in WORKFLOW] == WORKFLOW  # the workflow's commands in its order
    assert names == [n for n in _Group.ORDER if n in names] + sorted(n for n in names if n not in _Group.ORDER)
    assert len(rows) == len(listing)  # every description is whole on one line: nothing wrapped or cut
    for l in listing:
        assert "..." not in l and len(l) <= 80, l
    assert all(len(l) <= 80 for l in cp.stdout.splitlines())
    assert "commdiag sweep sweeps/nvlink2-aa.yaml" in cp.stdout  # the workflow, in the help too


def test_every_option_of_every_command_is_documented():
    import click

    from commdiag.cli import main

    for name, cmd in main.commands.items():
        assert cmd.help and cmd.short_help, name
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            assert p.help, f"{name} {p.opts}"
    for opt in ("--no-torchrun", "--nproc", "--no-verify"):
        assert f"`{opt}" in README, opt
    assert "--no-torchrun" in run_cli("check-env", "--help").stdout
    assert "cannot run here" in run_cli("install-hook", "--help").stdout


def test_explain_help_and_docs_agree_on_old_nccl_versions():
    help_text = " ".join(run_cli("explain", "--help").stdout.split())
    docs = " ".join((REPO / "docs" / "explain.md").read_text().split())
    assert "older versions log numeric ids (mapped to names, channels unknown) or nothing" in help_text
    assert "older versions print numeric ids, which are mapped to names" in docs and "NCCL >= 2.24" in docs


# --------------------------------------------------------------------------- output


def test_check_env_without_an_expectation_says_so_plainly():
    cp = cli("check-env", env=clean_env())
    assert cp.returncode == 0, cp.stderr
    assert "expectation from none" not in cp.stdout
    assert cp.stdout.splitlines()[1] == ("no expectation given (--expect, --profile) and no commdiag hook "
                                         "installed: listing only")


def test_propagation_warns_when_the_expected_variable_is_not_exported_and_summarises():
    cp = cli("check-env", "--propagation", "--no-torchrun", "--expect", "NCCL_ALGO=Ring", env=clean_env())
    out = cp.stdout
    assert cp.returncode == 1
    assert out.startswith("warning: NCCL_ALGO not set in the shell that ran this command")
    assert "  NCCL_ALGO=Ring commdiag check-env --propagation ..." in out
    summary = out.split("summary per path", 1)[1].splitlines()
    assert "  FAIL multiprocessing spawn" in "\n".join(summary) and "missing NCCL_ALGO" in summary[2]
    assert summary[-1] == "0 of 6 paths carried every expected variable (NCCL_ALGO not set in this shell: see the warning)"
    assert all(len(l) <= 100 for l in out.splitlines() if not l.startswith("      "))

    cp = cli("check-env", "--propagation", "--no-torchrun", "--expect", "NCCL_ALGO=Ring", env=clean_env(NCCL_ALGO="Ring"))
    assert cp.returncode == 0 and "warning" not in cp.stdout
    lines = cp.stdout.splitlines()
    assert lines[-1] == "6 of 6 paths carried every expected variable"
    fs = next(l for l in lines if l.startswith("  ok   multiprocessing forkserver"))
    assert fs.endswith("every expected variable arrived; lost LATE")  # the fork server froze its environment
    cp_ = next(l for l in lines if l.startswith("  ok   subprocess env=os.environ.copy()"))
    assert cp_.endswith("lost LATE, PUTENV")


def test_explain_no_run_on_a_gloo_run_says_gloo_never_loads_nccl(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "fixtures" / "runs" / "cpu-aa-a", run)
    for args in (("explain", "--no-run", run), ("explain", run)):
        cp = run_cli(*args)
        assert cp.returncode == 2, cp.stdout
        assert "backend 'gloo', which never loads NCCL, so NCCL settings have no effect" in cp.stderr
        assert "run  commdiag explain" not in cp.stderr  # no suggestion of a command that refuses gloo
        first, *rest = cp.stderr.splitlines()  # one message: wrapped at 100 columns under its first line
        assert first.startswith("commdiag: error: ") and all(l.startswith("    ") for l in rest)
        assert all(len(l) <= 100 for l in cp.stderr.splitlines() if " " in l.strip())


def test_detect_explains_a_shadowed_sitecustomize_like_doctor(tmp_path):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    extra = tmp_path / "extra"
    extra.mkdir()
    (site / "sitecustomize.py").write_text("A = 1\n")
    (extra / "sitecustomize.py").write_text("B = 1\n")
    (site / "extra.pth").write_text(f"{extra}\n")  # appended to sys.path: after site-packages, so shadowed
    cp = run_cli("detect", "--python", py)
    lines = cp.stdout.splitlines()
    # the path after its label, or on the next line when the two do not fit 100 columns together; where the
    # interpreter's standard library ships a sitecustomize (Debian, Ubuntu), the venv's own is listed too
    label = "    SHADOWED (will not load):"
    shadowed = {}  # path -> index of the line that ends its entry (the explanation follows)
    for n, l in enumerate(lines):
        if l == label:
            shadowed[lines[n + 1].strip()] = n + 1
        elif l.startswith(label + " "):
            shadowed[l[len(label):].strip()] = n
    assert str(extra / "sitecustomize.py") in shadowed, lines
    at = shadowed[str(extra / "sitecustomize.py")]
    explained = []
    for l in lines[at + 1:]:
        if not l.startswith("      "):
            break
        explained.append(l)
    block = " ".join(l.strip() for l in explained)
    assert lines[at + 1].startswith("      why: `import sitecustomize` in")
    assert "Python runs only the first one it finds" in block
    assert f"do: commdiag install-hook --python {py} (it installs a .pth hook" in " ".join(block.split())
    assert all(len(l) <= 100 for l in explained if " " in l.strip())  # a lone long path may stand alone
    rep = json.loads(run_cli("doctor", "--json", "--python", py).stdout)
    f = next(f for f in rep["findings"] if f["check"] == f"hooks {py}" and f["severity"] == "warning")
    assert "Python runs only the first one it finds" in f["evidence"]
    assert f["action"].startswith(f"use `commdiag install-hook --python {py}`")


def test_detect_says_why_the_topology_is_missing_once():
    cp = run_cli("detect")
    if "Topology: unavailable: " not in cp.stdout:
        pytest.skip("this machine has NVML: the topology is available")
    reason = cp.stdout.split("Topology: unavailable: ", 1)[1].splitlines()[0]
    assert cp.stdout.count(reason) == 1
    assert "topology checks (NVLink/PCIe, P2P, LL128, NVLS) are skipped; the rest works" in cp.stdout


def test_doctor_and_detect_text_fits_100_columns():
    rec = REPO / "tests" / "fixtures" / "h200x2-nvlink" / "nvml-readings.json"
    out = {}
    for args in (("doctor", "--nvml-replay", rec, "--expect", "NCCL_PROTO=LL"), ("detect", "--nvml-replay", rec)):
        cp = cli(*args, env=clean_env())
        out[args[0]] = cp.stdout
        # a single path longer than a line is left whole; everything with a space in it is wrapped
        long = [l for l in cp.stdout.splitlines() if len(l) > 100 and " " in l.strip()]
        assert not long, long
    doc = out["doctor"].splitlines()
    at = next(n for n, l in enumerate(doc) if l.startswith("           do: export it where the workers start"))
    assert doc[at + 1].startswith("               ")  # continuation aligned under the text


def test_check_env_rows_fit_100_columns_with_the_detail_below():
    cp = cli("check-env", "--expect", "NCCL_PROTO=LL", "--expect", "NCCL_ALGO=Ring", env=clean_env(NCCL_ALGO="Tree"))
    lines = cp.stdout.splitlines()
    assert cp.returncode == 1 and all(len(l) <= 100 for l in lines)
    at = next(n for n, l in enumerate(lines) if l.startswith("  MISMATCH   NCCL_ALGO"))
    assert lines[at + 1] == "             expected 'Ring', got 'Tree'"


def test_readme_gpu_path_commands_parse():
    """Every commdiag command line of the GPU path names a real command and options it has; sweep specs load."""
    from commdiag.formats import spec as spec_mod

    gpu = README.split("## On your GPU box", 1)[1].split("## Commands", 1)[0]
    found = re.findall(r"(?:^|[`\s])(?:sudo \"\$\(command -v commdiag\)\"|commdiag) ((?:[a-z-]+)(?: [^`#\n]*)?)", gpu,
                       re.M)
    from commdiag.cli import main

    helps = {}
    seen = set()
    for cmd in found:
        words = cmd.split()
        sub = words[0]
        if sub not in main.commands:  # prose such as "commdiag into that venv"
            continue
        if sub not in helps:
            cp = run_cli(sub, "--help")
            assert cp.returncode == 0, (sub, cp.stderr)
            helps[sub] = cp.stdout
        for w in words[1:]:
            if w.startswith("--"):
                assert w in helps[sub], (sub, w)
        if sub == "sweep" and words[1].endswith(".yaml"):
            sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
            spec_mod.load_spec(REPO / words[1], sets)
        seen.add(sub)
    assert {"doctor", "sweep", "report", "explain", "install-hook"} <= seen, seen
