"""install-hook --tuner end to end: a real cc build, a staged --root, a throwaway venv inside it,
a fresh interpreter that sees both variables, status, dry run, byte-exact undo.

Everything is written under the test's temporary directory (``--root``); the module fixture
checks that the machine's own commdiag state and nccl.conf are untouched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.errors import CommdiagError
from commdiag.install import hookstate, hooktuner
from commdiag.tuner import build
from conftest import REPO, one_message, words

pytestmark = pytest.mark.skipif(
    shutil.which((shlex.split(os.environ.get("CC", "")) or ["cc"])[0]) is None,
    reason="no C compiler (cc or $CC): install-hook --tuner compiles the plugin")

RULES = (b"# commdiag-tuner-rules 1\n"
         b"# 2x H200, all-reduce: LL up to 2 MiB\n"
         b"coll=allreduce min_bytes=0 max_bytes=2097152 nranks=2 nnodes=1 algo=ring proto=ll\n")
TUNER_DIR = "/var/lib/commdiag/tuner"
LIB = f"{TUNER_DIR}/libnccl-tuner-commdiag.so"
RULES_AT = f"{TUNER_DIR}/commdiag-tuner-rules.txt"
NAMES = ("NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE", "NCCL_PROTO")
SYSTEM = ["/var/lib/commdiag", "/etc/nccl.conf", os.path.expanduser("~/.nccl.conf"),
          os.path.expanduser("~/.local/state/commdiag")]


def _fingerprint(path: str):
    if os.path.isfile(path):
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return sorted(os.listdir(path)) if os.path.isdir(path) else None


@pytest.fixture(autouse=True, scope="module")
def system_untouched():
    before = {p: _fingerprint(p) for p in SYSTEM}
    yield
    assert {p: _fingerprint(p) for p in SYSTEM} == before


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
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(Path(p).read_bytes()).hexdigest())
    return out


def cli(*args, check=None, env=None):
    e = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    for name in NAMES:
        e.pop(name, None)
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *map(str, args)],
                        capture_output=True, text=True, env=e, timeout=180)
    if check is not None:
        assert cp.returncode == check, cp.stdout + cp.stderr
    return cp


_template: list[Path] = []


def make_venv(dest: Path, tmp_path_factory) -> Path:
    """A throwaway venv inside the staged root (copied from one made per module: creation is the slow part)."""
    if not _template:
        t = tmp_path_factory.mktemp("venv-template") / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(t)], check=True, timeout=120)
        _template.append(t)
    shutil.copytree(_template[0], dest, symlinks=True)
    return dest / "bin/python"


def sees(python: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    code = "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
    cp = subprocess.run([str(python), "-c", code, *NAMES], capture_output=True, text=True, env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir(mode=0o755)
    return r


@pytest.fixture
def rules_file(tmp_path):
    p = tmp_path / "rules.txt"
    p.write_bytes(RULES)
    return p


def test_install_status_reinstall_and_exact_undo(root, rules_file, tmp_path_factory):
    py = make_venv(root / "venv", tmp_path_factory)
    (root / "etc").mkdir()
    (root / "etc/nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    before = tree(root)
    common = ["--root", root, "--python", py, "--tuner", rules_file, "--set", "NCCL_PROTO=LL", "--nccl-conf",
              "--systemd", "sglang"]

    # dry run: the whole plan, the library as size and hash (never its bytes), and nothing changed
    cp = cli(*common, "--dry-run", check=0)
    assert tree(root) == before
    # the header names the file written (staged under --root), then the target's path
    assert f"--- {root}{LIB}: commdiag's file (absent -> file, mode 0755)" in words(cp.stdout)
    assert "  planned: " in cp.stdout and " bytes, sha256 " in words(cp.stdout) and "ELF" not in words(cp.stdout)
    assert (f"--- {root}{RULES_AT}: commdiag's file (absent -> file, mode 0644) staged under --root; the target "
            f"system's path: {RULES_AT}") in words(cp.stdout)
    assert "+coll=allreduce min_bytes=0 max_bytes=2097152" in words(cp.stdout)
    assert f"+NCCL_TUNER_PLUGIN={LIB}" in words(cp.stdout)

    # install: the files in the stable place, the target's paths (no staging prefix) everywhere
    cp = cli(*common, check=0)
    assert "verify: OK" in words(cp.stdout) and "see all 3 settings" in words(cp.stdout)
    lib, rules = root / LIB.lstrip("/"), root / RULES_AT.lstrip("/")
    assert rules.read_bytes() == RULES and stat.S_IMODE(rules.stat().st_mode) == 0o644
    assert stat.S_IMODE(lib.stat().st_mode) == 0o755
    assert build.exported_symbols(lib) == build.SYMBOLS  # a working plugin, as NCCL would dlopen it
    conf = (root / "etc/nccl.conf").read_text()
    assert conf.startswith("NCCL_DEBUG=WARN\n")
    assert f"\nNCCL_TUNER_PLUGIN={LIB}\nNCCL_TUNER_CONFIG_FILE={RULES_AT}\n" in conf
    dropin = (root / "etc/systemd/system/sglang.service.d/commdiag-nccl.conf").read_text()
    assert f'Environment="NCCL_TUNER_PLUGIN={LIB}"' in dropin
    assert f'Environment="NCCL_TUNER_CONFIG_FILE={RULES_AT}"' in dropin
    assert not [line for line in (conf + dropin).splitlines() if "TUNER" in line and str(root) in line]
    # a python started with the hook sees both variables (and the --set beside them)
    assert sees(py) == {"NCCL_TUNER_PLUGIN": LIB, "NCCL_TUNER_CONFIG_FILE": RULES_AT, "NCCL_PROTO": "LL"}

    # status: both files as installed (sha256 and mode), the rules parse as the plugin reads them
    cp = cli("--status", "--root", root, "--python", py, "--json", check=0)
    (tuner,) = [i for i in json.loads(cp.stdout)["installs"] if i["kind"] == "tuner"]
    assert tuner["target"] == TUNER_DIR and tuner["rules_ok"] is True
    assert [(f["path"], f["state"]) for f in tuner["files"]] == [(LIB, "as installed"), (RULES_AT, "as installed")]
    assert "rules: OK: 1 rule, parsed as the plugin reads them" in cli("--status", "--root", root, check=0).stdout

    # the same install again changes nothing; new rules change only the rules file
    assert "nothing to change: already in place" in cli(*common, check=0).stdout
    rules_file.write_bytes(RULES + b"coll=allgather min_bytes=0 max_bytes=65536 nranks=2 nnodes=1 algo=ring proto=ll\n")
    cp = cli(*common, check=0)
    # the lines name the files written: under --root, the staged ones
    assert (f"commdiag's file: {root}{RULES_AT} (file -> file)" in words(cp.stdout)
            and f"commdiag's file: {root}{LIB}" not in words(cp.stdout))
    assert rules.read_bytes() == rules_file.read_bytes()

    # rules edited on disk into something the plugin refuses: status says so, names the line
    rules.write_bytes(RULES + b"coll=allreduce algo=ring\n")
    cp = cli("--status", "--root", root, check=1)
    assert f"{RULES_AT}: changed since install" in words(cp.stdout)
    assert "rules: FAIL: the plugin would refuse them:" in words(cp.stdout) and "line 4: missing key" in words(cp.stdout)
    rules.write_bytes(rules_file.read_bytes())

    # the tuner files stay while an install names them, and go with the last one
    cli("--uninstall", "--root", root, "--python", py, check=0)
    assert lib.exists() and sees(py)["NCCL_TUNER_PLUGIN"] is None
    cli("--uninstall", "--root", root, "--systemd", "sglang", "--nccl-conf", check=0)
    assert tree(root) == before


def test_an_install_without_tuner_removes_the_earlier_tuner_files(root, rules_file):
    before = tree(root)
    cli("--root", root, "--tuner", rules_file, "--nccl-conf", check=0)
    assert (root / LIB.lstrip("/")).is_file()
    cp = cli("--root", root, "--set", "NCCL_PROTO=LL", "--nccl-conf", check=0)
    assert "the tuner files are no longer named by any install; removed" in words(cp.stdout)
    assert not (root / TUNER_DIR.lstrip("/")).exists()
    assert (root / "etc/nccl.conf").read_text().count("NCCL_TUNER") == 0
    cli("--uninstall", "--root", root, "--nccl-conf", check=0)
    assert tree(root) == before


def test_files_that_are_not_commdiags_are_refused_then_restored_byte_for_byte(root, rules_file):
    d = root / TUNER_DIR.lstrip("/")
    d.mkdir(parents=True)
    theirs = b"\x7fELF someone else's library\x00\x01"
    (d / "libnccl-tuner-commdiag.so").write_bytes(theirs)
    os.chmod(d / "libnccl-tuner-commdiag.so", 0o700)
    (d / "commdiag-tuner-rules.txt").write_bytes(b"# commdiag-tuner-rules 1\n# theirs\n")
    before = tree(root)
    cp = cli("--root", root, "--tuner", rules_file, "--nccl-conf", check=2)
    assert f"{LIB}: exists and is not commdiag's" in words(cp.stderr) and "Traceback" not in words(cp.stderr)
    assert tree(root) == before
    cp = cli("--root", root, "--tuner", rules_file, "--nccl-conf", "--force", "--dry-run", check=0)
    assert f"  now: {len(theirs)} bytes, sha256 {hashlib.sha256(theirs).hexdigest()}" in cp.stdout
    assert "someone" not in words(cp.stdout)  # a binary: never its bytes
    assert tree(root) == before
    cp = cli("--root", root, "--tuner", rules_file, "--nccl-conf", "--force", check=0)
    assert "replacing a file that is not commdiag's (--force)" in words(cp.stdout)
    assert (d / "commdiag-tuner-rules.txt").read_bytes() == RULES
    cli("--uninstall", "--root", root, "--nccl-conf", check=0)
    assert tree(root) == before


def test_bad_rules_are_one_error_naming_the_line_and_nothing_changes(root, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(RULES + b"coll=allreduce min_bytes=0 max_bytes=1 nranks=2 nnodes=1 algo=warp proto=ll\n")
    before = tree(root)
    cp = cli("--root", root, "--tuner", bad, "--nccl-conf", check=2)
    assert one_message(cp.stderr) and "Traceback" not in words(cp.stderr)
    assert f"{bad}: line 4: " in words(cp.stderr) and "warp" in words(cp.stderr)
    assert tree(root) == before
    # not a regular file: refused as the plugin refuses it, without blocking on a FIFO
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cp = cli("--root", root, "--tuner", fifo, "--nccl-conf", check=2)
    assert f"{fifo}: not a regular file" in words(cp.stderr)
    cp = cli("--root", root, "--tuner", tmp_path / "missing.txt", "--nccl-conf", check=2)
    assert "missing.txt: cannot open: No such file or directory" in words(cp.stderr)
    assert tree(root) == before


def test_a_run_folder_needs_commdiag_tuner_rules(root, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    before = tree(root)
    cp = cli("--root", root, "--tuner", run, "--nccl-conf", check=2)
    if importlib.util.find_spec("commdiag.tuner.fromrun") is None:
        assert "rules from a run folder need commdiag tuner rules" in words(cp.stderr)
    assert "Traceback" not in words(cp.stderr)  # with fromrun: its own error, an empty folder certifies nothing
    assert tree(root) == before


def test_no_compiler_is_one_error_before_anything_changes(root, rules_file):
    before = tree(root)
    cp = cli("--root", root, "--tuner", rules_file, "--nccl-conf", "--cc", "/nonexistent/cc", check=2)
    assert "no C compiler" in words(cp.stderr) and "Traceback" not in words(cp.stderr)
    assert tree(root) == before


def test_tuner_with_status_or_uninstall_is_a_usage_error(root, rules_file):
    for flag in ("--status", "--uninstall"):
        cp = cli(flag, "--root", root, "--tuner", rules_file, check=2)
        assert "--tuner installs" in words(cp.stderr)


def test_a_tuner_variable_given_twice_is_refused(root, rules_file):
    cp = cli("--root", root, "--tuner", rules_file, "--set", "NCCL_TUNER_PLUGIN=/x.so", "--nccl-conf", check=2)
    assert "NCCL_TUNER_PLUGIN: given by --tuner and also by" in words(cp.stderr)


@pytest.mark.parametrize("state, why", [
    ("/home/a b/.local/state/commdiag", "contains ' '"),
    ("/srv/x'y/commdiag", "contains \"'\""),
    ("/srv/%h/commdiag", "contains '%'"),
    ("/srv/" + "d" * 240 + "/commdiag", "longer than 254 characters"),
])
def test_paths_no_target_can_carry_are_refused_before_compiling(rules_file, monkeypatch, state, why):
    monkeypatch.setattr(hooktuner, "compile_library", lambda *a: pytest.fail("compiled before the paths were checked"))
    with pytest.raises(CommdiagError, match="NCCL_TUNER_PLUGIN") as e:
        hooktuner.prepare(rules_file, state)
    assert why in str(e.value)


def test_the_manifest_accepts_exactly_the_tuner_file_names():
    assert hookstate.TUNER_NAMES == hooktuner.FILE_NAMES


@pytest.mark.parametrize("where", ["usr/lib/tuner", "var/lib/other/tuner", "var/lib/commdiag"])
def test_a_manifest_naming_a_tuner_file_elsewhere_is_refused(root, rules_file, where):
    cli("--root", root, "--tuner", rules_file, "--nccl-conf", check=0)
    manifest = root / "var/lib/commdiag/installs.json"
    m = json.loads(manifest.read_text())
    (tuner,) = [r for r in m["installs"] if r["kind"] == "tuner"]
    tuner["files"][0]["path"] = str(root / where / "libnccl-tuner-commdiag.so")
    manifest.write_text(json.dumps(m))
    before = tree(root)
    cp = cli("--uninstall", "--all", "--root", root, check=2)
    assert "is not a file commdiag writes in the owned role" in words(cp.stderr) and "Traceback" not in words(cp.stderr)
    assert tree(root) == before
