"""install-hook end to end: real venvs, real interpreter starts, a staged root, byte-exact undo.

Every install goes into a staged tree (``--root``) and into throwaway venvs created
inside it, so nothing outside the test's temporary directory is written; the
session fixture below checks that the machine's own sitecustomize, nccl.conf and
commdiag state are untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import words

from commdiag.install import hooktext

from pythons import plain_python

DEBIAN_PY = "/usr/bin/python3.11"
DEBIAN_SC = "/usr/lib/python3.11/sitecustomize.py"
SETTINGS = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
SETS = [a for n, v in SETTINGS.items() for a in ("--set", f"{n}={v}")]
needs_debian = pytest.mark.skipif(not (os.path.islink(DEBIAN_SC) and os.path.exists(DEBIAN_PY)),
                                  reason="needs Debian's python3.11 with its symlinked sitecustomize.py")
SYSTEM_FILES = ["/etc/python3.11/sitecustomize.py", DEBIAN_SC, "/etc/nccl.conf", "/var/lib/commdiag"]


def _fingerprint(path: str):
    if os.path.islink(path):
        return ("link", os.readlink(path))
    if os.path.isfile(path):
        return ("file", hashlib.sha256(Path(path).read_bytes()).hexdigest(), os.stat(path).st_mode)
    return ("dir", sorted(os.listdir(path))) if os.path.isdir(path) else None


@pytest.fixture(autouse=True, scope="module")
def system_untouched():
    before = {p: _fingerprint(p) for p in SYSTEM_FILES}
    yield
    assert {p: _fingerprint(p) for p in SYSTEM_FILES} == before


def tree(root: Path) -> dict:
    """Every path under root: type, permission bits, link target or content hash."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_uid,
                            hashlib.sha256(Path(p).read_bytes()).hexdigest())
    return out


def cli(*args, env=None, check=None, **kw):
    e = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    for name in SETTINGS:
        e.pop(name, None)
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *args], capture_output=True,
                        text=True, env=e, timeout=180, **kw)
    if check is not None:
        assert cp.returncode == check, cp.stdout + cp.stderr
    return cp


_SEE = ("import ctypes, json, os, sys\n"
        "libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p\n"
        "names = sys.argv[1:]\n"
        "print(json.dumps({n: [os.environ.get(n), (libc.getenv(n.encode()) or b'').decode() or None] for n in names}))\n")


def sees(python, env_extra=None, flags=()):
    """What a fresh start of ``python`` has for SETTINGS' names: {name: [os.environ, getenv]}."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env.update({"PYTHONDONTWRITEBYTECODE": "1", **(env_extra or {})})
    cp = subprocess.run([str(python), *flags, "-c", _SEE, *SETTINGS], capture_output=True, text=True, env=env,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


ARRIVED = {n: [v, v] for n, v in SETTINGS.items()}
NOTHING = {n: [None, None] for n in SETTINGS}

_templates: dict[str, Path] = {}


def make_venv(base_python: str, dest: Path, tmp_path_factory) -> Path:
    """A throwaway venv (copied from a per-session template: venv creation is the slow part)."""
    if base_python not in _templates:
        t = tmp_path_factory.mktemp("venv-template") / "venv"
        subprocess.run([base_python, "-m", "venv", "--without-pip", str(t)], check=True, timeout=120)
        _templates[base_python] = t
    shutil.copytree(_templates[base_python], dest, symlinks=True)
    return dest


def site_packages(venv: Path) -> Path:
    (sp,) = venv.glob("lib/python3.*/site-packages")
    return sp


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir(mode=0o755)
    return r


def stage_debian(root: Path, relative_link: bool = False) -> Path:
    """root/usr/lib/python3.11/sitecustomize.py -> root/etc/python3.11/sitecustomize.py, like Debian."""
    etc = root / "etc/python3.11"
    etc.mkdir(parents=True)
    shutil.copy2(os.path.realpath(DEBIAN_SC), etc / "sitecustomize.py")
    lib = root / "usr/lib/python3.11"
    lib.mkdir(parents=True)
    target = "../../../etc/python3.11/sitecustomize.py" if relative_link else os.readlink(DEBIAN_SC)
    (lib / "sitecustomize.py").symlink_to(target)
    return etc / "sitecustomize.py"


# --------------------------------------------------------------------------- the shadowing case

@needs_debian
def test_debian_venv_own_sitecustomize_is_shadowed_so_pth_is_used(root, tmp_path_factory):
    venv = make_venv(DEBIAN_PY, root / "venv", tmp_path_factory)
    sp = site_packages(venv)
    (sp / "sitecustomize.py").write_text("import os\nos.environ['NCCL_PROTO'] = 'FROM_VENV_SITECUSTOMIZE'\n")
    stage_debian(root)
    # the problem users hit: the venv's own sitecustomize never runs
    assert sees(venv / "bin/python") == NOTHING
    before = tree(root)
    cp = cli("--python", str(venv / "bin/python"), "--root", str(root), *SETS, check=0)
    assert "is shadowed by /usr/lib/python3.11/sitecustomize.py" in words(cp.stdout)
    assert (sp / hooktext.PTH_NAME).read_text() == hooktext.PTH_LINE
    assert "verify: OK" in words(cp.stdout)
    assert sees(venv / "bin/python") == ARRIVED
    assert (sp / "sitecustomize.py").read_text().startswith("import os\n")  # untouched
    installed = tree(root)
    cp = cli("--python", str(venv / "bin/python"), "--root", str(root), *SETS, check=0)  # the same again
    assert "nothing to change: already in place" in words(cp.stdout) and tree(root) == installed
    # --method sitecustomize for this venv would edit a file every python3.11 loads: falls back to pth
    cp = cli("--python", str(venv / "bin/python"), "--root", str(root), "--method", "sitecustomize", *SETS, check=0)
    assert "installing with the .pth method instead" in words(cp.stdout)
    assert os.readlink(root / "usr/lib/python3.11/sitecustomize.py") == os.readlink(DEBIAN_SC)
    cli("--uninstall", "--python", str(venv / "bin/python"), "--root", str(root), check=0)
    assert tree(root) == before
    assert sees(venv / "bin/python") == NOTHING


@needs_debian
def test_debian_system_sitecustomize_gets_a_block_at_the_link_target(root):
    target = stage_debian(root, relative_link=True)
    original = target.read_bytes()
    os.chmod(target, 0o640)
    before = tree(root)
    cp = cli("--python", DEBIAN_PY, "--method", "sitecustomize", "--root", str(root), *SETS, check=0)
    link = root / "usr/lib/python3.11/sitecustomize.py"
    assert os.readlink(link) == "../../../etc/python3.11/sitecustomize.py"  # the link itself is kept
    text = target.read_bytes()
    assert text.startswith(original) and hooktext.BEGIN.encode() in text
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640  # the edited file keeps its permissions
    assert "not started: the hook was staged" in words(cp.stdout)
    # the staged file really works: import it (through the link) in a real python3.11 start
    probe = (f"import sys; sys.path.insert(0, {str(link.parent)!r}); import sitecustomize, os; "
             "print(os.environ.get('NCCL_PROTO'), sitecustomize.__file__)")
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    out = subprocess.run([DEBIAN_PY, "-S", "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["LL", str(link)]
    cli("--uninstall", "--python", DEBIAN_PY, "--root", str(root), check=0)
    assert tree(root) == before


# --------------------------------------------------------------------------- the project's python

def test_project_python_venv_sitecustomize_method_and_user_value_wins(root, tmp_path_factory):
    venv = make_venv(plain_python(), root / "venv", tmp_path_factory)
    py = venv / "bin/python"
    before = tree(root)
    cp = cli("--python", str(py), "--root", str(root), "--method", "sitecustomize", *SETS, check=0)
    sc = site_packages(venv) / "sitecustomize.py"
    assert sc.read_text().startswith(hooktext.BEGIN)
    assert stat.S_IMODE(sc.stat().st_mode) == 0o644
    assert "verify: OK" in words(cp.stdout)
    assert sees(py) == ARRIVED
    assert sees(py, {"NCCL_PROTO": "Simple"})["NCCL_PROTO"] == ["Simple", "Simple"]  # a value set by the user wins
    cli("--python", str(py), "--root", str(root), "--method", "sitecustomize", "--override", *SETS, check=0)
    assert sees(py, {"NCCL_PROTO": "Simple"})["NCCL_PROTO"] == ["LL", "LL"]
    cli("--uninstall", "--python", str(py), "--root", str(root), check=0)
    assert tree(root) == before


def test_spawn_child_and_status(root, tmp_path_factory):
    venv = make_venv(sys.executable, root / "venv", tmp_path_factory)
    py = venv / "bin/python"
    cli("--python", str(py), "--root", str(root), *SETS, check=0)
    spawn = ("import multiprocessing as mp, os\n"
             "def f(q): q.put(os.environ.get('NCCL_PROTO'))\n"
             "if __name__ == '__main__':\n"
             "    ctx = mp.get_context('spawn'); q = ctx.Queue(); p = ctx.Process(target=f, args=(q,))\n"
             "    p.start(); print(q.get(timeout=60)); p.join()\n")
    script = root.parent / "spawn_check.py"
    script.write_text(spawn)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    assert subprocess.run([str(py), str(script)], capture_output=True, text=True, env=env,
                          timeout=120).stdout.strip() == "LL"
    cp = cli("--status", "--python", str(py), "--root", str(root), check=0)
    assert "loads at start: yes" in words(cp.stdout) and "check-env in a fresh process: OK" in words(cp.stdout)
    # check-env inside the target, with no expectation given, expects the installed hook's settings
    pkg = str(Path(__file__).resolve().parent.parent)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from commdiag.environment import envcheck; import json; "
            "r = envcheck.check_env(); print(json.dumps([envcheck.installed_settings(), r.source, r.ok]))")
    for flags, ok in (([], True), (["-S"], False)):
        out = subprocess.run([str(py), *flags, "-c", code, pkg], capture_output=True, text=True, env=env,
                             timeout=60, check=True).stdout
        assert json.loads(out) == [SETTINGS, "installed hook", ok]
    # -S turns site processing off: the hook cannot run, and status says so
    assert sees(py, flags=["-S"]) == NOTHING
    cp = cli("--status", "--python", str(py), "--root", str(root), "--python-flag", "-S", check=1)
    assert "loads at start: NO; site processing is off (-S)" in words(cp.stdout)
    # a profile that differs, and a file changed since install
    cp = cli("--status", "--python", str(py), "--root", str(root), "--set", "NCCL_PROTO=Simple", "--json", check=1)
    (inst,) = json.loads(cp.stdout)["installs"]
    assert inst["matches_profile"] is False and inst["loads"] is True
    mod = site_packages(venv) / (hooktext.HOOK_MODULE + ".py")
    mod.write_text(mod.read_text() + "# edited\n")
    cp = cli("--status", "--python", str(py), "--root", str(root), check=1)
    assert f"{mod}: changed since install" in words(cp.stdout)


# --------------------------------------------------------------------------- a hook that breaks

BREAKAGES = {
    "body raises SystemExit": lambda t: t.replace("os.environ[name] = value", "raise SystemExit(3)"),
    "body raises KeyboardInterrupt": lambda t: t.replace("os.environ[name] = value", "raise KeyboardInterrupt"),
    "module raises SystemExit at top": lambda t: "raise SystemExit(3)\n" + t,
    "module corrupted": lambda t: "def (:\n" + t,
    "module deleted": lambda t: None,
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_hook_never_stops_python(breakage, root, tmp_path_factory):
    venv = make_venv(sys.executable, root / "venv", tmp_path_factory)
    py = venv / "bin/python"
    cli("--python", str(py), "--root", str(root), *SETS, "--no-verify", check=0)
    mod = site_packages(venv) / (hooktext.HOOK_MODULE + ".py")
    broken = BREAKAGES[breakage](mod.read_text())
    if broken is None:
        mod.unlink()
    else:
        assert broken != mod.read_text()
        mod.write_text(broken)
    cp = subprocess.run([str(py), "-B", "-c", "print('alive')"], capture_output=True, text=True, timeout=60)
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, "alive\n", "")


def test_sitecustomize_block_that_raises_never_stops_python(root, tmp_path_factory):
    venv = make_venv(plain_python(), root / "venv", tmp_path_factory)
    py = venv / "bin/python"
    cli("--python", str(py), "--root", str(root), "--method", "sitecustomize", *SETS, "--no-verify", check=0)
    sc = site_packages(venv) / "sitecustomize.py"
    sc.write_text(sc.read_text().replace("os.environ[name] = value", "raise SystemExit(3)"))
    cp = subprocess.run([str(py), "-B", "-c", "print('alive')"], capture_output=True, text=True, timeout=60)
    assert (cp.returncode, cp.stdout) == (0, "alive\n")
    # the control: the same SystemExit outside commdiag's guard stops every start of the interpreter
    sc.write_text("raise SystemExit(3)\n")
    assert subprocess.run([str(py), "-B", "-c", "print('alive')"], capture_output=True, timeout=60).returncode != 0


# --------------------------------------------------------------------------- exact undo, dry run, safety

def test_uninstall_restores_bytes_modes_symlinks_not_bytecode(root, tmp_path_factory):
    venv = make_venv(plain_python(), root / "venv", tmp_path_factory)
    py = venv / "bin/python"
    sp = site_packages(venv)
    sc = sp / "sitecustomize.py"
    sc.write_bytes(b"# theirs, no newline at the end")
    os.chmod(sc, 0o600)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(py), "-c", "import sitecustomize"], check=True, env=env)  # their bytecode in __pycache__
    assert list((sp / "__pycache__").glob("sitecustomize.*.pyc"))
    (root / "elsewhere.pth").write_text("# a foreign file\n")
    (sp / hooktext.PTH_NAME).symlink_to(root / "elsewhere.pth")  # a foreign symlink where the .pth goes
    before = tree(root)
    cp = cli("--python", str(py), "--root", str(root), *SETS, check=2)
    assert "is not commdiag's" in words(cp.stderr) and tree(root) == before
    cli("--python", str(py), "--root", str(root), *SETS, "--force", check=0)
    cli("--python", str(py), "--root", str(root), "--method", "sitecustomize", *SETS, check=0)
    assert not list((sp / "__pycache__").glob("sitecustomize.*.pyc"))  # stale bytecode removed
    assert sees(py) == ARRIVED
    cli("--uninstall", "--python", str(py), "--root", str(root), check=0)
    # bytecode is never put back (a .pyc is code, and Python makes it again from the source)
    assert tree(root) == {k: v for k, v in before.items() if not k.endswith(".pyc")}
    subprocess.run([str(py), "-c", "import sitecustomize"], check=True, env=env)
    assert tree(root) == before | {k: v for k, v in tree(root).items() if k.endswith(".pyc")}


def test_dry_run_changes_nothing_and_prints_the_plan(root, tmp_path_factory):
    venv = make_venv(sys.executable, root / "venv", tmp_path_factory)
    (root / "etc").mkdir()
    (root / "etc/nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    before = tree(root)
    cp = cli("--python", str(venv / "bin/python"), "--root", str(root), *SETS, "--systemd", "sglang",
             "--nccl-conf", "--dry-run", check=0)
    assert tree(root) == before
    assert "SETTINGS = {'NCCL_PROTO': 'LL', 'NCCL_ALGO': 'Ring'}" in words(cp.stdout)
    assert '+Environment="NCCL_PROTO=LL"' in words(cp.stdout)
    assert "+NCCL_PROTO=LL" in words(cp.stdout) and " NCCL_DEBUG=WARN" in words(cp.stdout)  # a diff of the existing file
    assert "systemctl daemon-reload" in words(cp.stdout)


def test_systemd_and_nccl_conf_install_and_undo(root):
    (root / "etc").mkdir()
    conf = root / "etc/nccl.conf"
    conf.write_text("NCCL_PROTO=Simple\nNCCL_DEBUG=WARN\n")
    before = tree(root)
    cp = cli("--method", "none", "--root", str(root), *SETS, "--systemd", "sglang", "--systemd-env-file",
             "--nccl-conf", check=0)
    dropin = root / "etc/systemd/system/sglang.service.d/commdiag-nccl.conf"
    assert "EnvironmentFile=/etc/commdiag/sglang.service.env\n" in dropin.read_text()
    assert stat.S_IMODE(dropin.stat().st_mode) == 0o644
    assert "systemctl restart sglang.service" in words(cp.stdout)
    from commdiag.environment.envcheck import parse_nccl_conf

    assert parse_nccl_conf(conf.read_text())["NCCL_PROTO"] == "Simple"  # the file's own line wins (first wins)
    assert parse_nccl_conf(conf.read_text())["NCCL_ALGO"] == "Ring"
    cli("--method", "none", "--root", str(root), *SETS, "--nccl-conf", "--override", check=0)
    assert parse_nccl_conf(conf.read_text())["NCCL_PROTO"] == "LL"  # --override: commdiag's block first
    cli("--uninstall", "--method", "none", "--root", str(root), "--systemd", "sglang", "--nccl-conf", check=0)
    assert tree(root) == before


def test_systemd_alone_installs_no_python_hook(root):
    before = tree(root)
    cp = cli("--root", str(root), *SETS, "--systemd", "sglang", check=0)  # no --method, no --python
    written = set(tree(root)) - set(before)
    assert written and all(f.split("/")[0] in ("etc", "var") for f in written), written  # nothing in a Python tree
    assert not any(f.endswith((".pth", "sitecustomize.py")) for f in written)
    assert "systemctl restart sglang.service" in words(cp.stdout)
    cli("--uninstall", "--root", str(root), "--systemd", "sglang", check=0)
    assert tree(root) == before


def test_concurrent_installs_end_in_one_consistent_state(root, tmp_path_factory):
    venv = make_venv(sys.executable, root / "venv", tmp_path_factory)
    py = venv / "bin/python"
    before = tree(root)
    e = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "commdiag.cli", "install-hook", "--python", str(py), "--root",
                               str(root), "--set", f"NCCL_PROTO={proto}", "--no-verify"], env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for proto in ("LL", "Simple", "LL128")]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    manifest = json.loads((root / "var/lib/commdiag/installs.json").read_text())
    (record,) = manifest["installs"]
    installed = hooktext.installed_settings([str(site_packages(venv))])
    assert installed == record["settings"] and installed["NCCL_PROTO"] in ("LL", "Simple", "LL128")
    assert {f["before"]["kind"] for f in record["files"]} == {"absent"}
    cli("--uninstall", "--python", str(py), "--root", str(root), check=0)
    assert tree(root) == before


def test_world_writable_target_directory_is_refused(root, tmp_path_factory):
    venv = make_venv(sys.executable, root / "venv", tmp_path_factory)
    sp = site_packages(venv)
    os.chmod(sp, 0o777)
    before = tree(root)
    cp = cli("--python", str(venv / "bin/python"), "--root", str(root), *SETS, check=2)
    assert "world-writable" in words(cp.stderr)
    assert tree(root) == before


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to nobody")
def test_permission_error_is_one_clear_message(tmp_path):
    pkg = Path(__file__).resolve().parent.parent
    if not os.access(pkg, os.R_OK | os.X_OK) or any(
            not (os.stat(p).st_mode & stat.S_IXOTH) for p in [pkg, *pkg.parents] if str(p) != "/"):
        pytest.skip("the checkout is not readable by nobody")
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="commdiag-perm-"))  # /tmp/pytest-of-root is closed to nobody
    os.chmod(top, 0o755)
    root = top / "root"
    root.mkdir(mode=0o755)
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from commdiag.install import hook\nfrom commdiag.errors import CommdiagError\n"
            "try:\n"
            "    hook.install(hook.Request(hook.resolve_settings(sets=['NCCL_PROTO=LL']), method='none',\n"
            "                 nccl_conf='system', root=sys.argv[2]))\n"
            "except CommdiagError as e:\n    print('ERROR', e)\n")
    cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", DEBIAN_PY if os.path.exists(
        DEBIAN_PY) else sys.executable, "-c", code, str(pkg), str(root)], capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(top), "PYTHONDONTWRITEBYTECODE": "1"})
    assert "ERROR" in words(cp.stdout) and "permission denied" in words(cp.stdout) and "needs root" in words(cp.stdout), cp.stdout + cp.stderr
    assert cp.stderr == ""
    assert list(root.iterdir()) == []
    shutil.rmtree(top)


# --------------------------------------------------------------------------- settings sources

def test_from_run_dir_without_winner_is_refused_with_the_reason(root, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"format": "commdiag-run", "version": 1}))
    (run / "profile-prefill.env").write_text("# commdiag-profile 1\nNCCL_PROTO=Simple\n")
    cp = cli("--from", str(run), "--method", "none", "--nccl-conf", "--root", str(root), check=2)
    # a run without stage 2: screening alone never makes a profile, and the error says what would
    assert "nothing to install" in words(cp.stderr) and "no confirmation (stage 2)" in words(cp.stderr)
    assert f"commdiag confirm {run}" in words(cp.stderr)
    assert "profile-prefill.env" in words(cp.stderr) and "--force" in words(cp.stderr)
    assert list(root.iterdir()) == []
    run_json = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**run_json, "version": 3, "confirmation": {"claims": []}}))
    cp = cli("--from", str(run), "--method", "none", "--nccl-conf", "--root", str(root), check=2)
    assert "the sweep certified no winner" in words(cp.stderr)
    cli("--from", str(run), "--force", "--set", "NCCL_ALGO=Tree", "--method", "none", "--nccl-conf",
        "--root", str(root), check=0)
    assert "NCCL_ALGO=Tree" in (root / "etc/nccl.conf").read_text()
    (run / "profile.env").write_text("# commdiag-profile 1\n# source: x\nNCCL_PROTO=LL\n")
    cli("--from", str(run), "--method", "none", "--nccl-conf", "--root", str(root), check=0)
    text = (root / "etc/nccl.conf").read_text()
    assert "NCCL_PROTO=LL" in text and "NCCL_ALGO" not in text and f"# source: {run}/profile.env" in text


def test_hostile_values_are_rejected_by_the_cli(root):
    for bad in ("NCCL_SOCKET_IFNAME=eth0\nNCCL_PROTO=LL", "NCCL_SOCKET_IFNAME=a\rb", "NCCL_PROTO=XX", "BAD NAME=1"):
        cp = cli("--method", "none", "--nccl-conf", "--root", str(root), "--set", bad, check=2)
        assert "commdiag: error:" in words(cp.stderr)
    assert list(root.iterdir()) == []
