"""What install-hook may install (#30 item 3): NCCL's settings and the few others commdiag documents;
never a loader or interpreter variable; a value naming a file NCCL loads must name one root owns and
nobody else can change; files NCCL writes are refused for system-wide targets; --dry-run shows the
settings that name files first.  ``ab --config`` as root follows the same rule.  A real throwaway user
owns the hostile files; the install is staged with --root.  No torch: runs under Debian's python3.11."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from commdiag.errors import CommdiagError
from commdiag.install import allowlist

from conftest import REPO, words
from users import give, needs_root, stage, staging, throwaway_user, user_fixture  # noqa: F401 (fixtures)

pytestmark = needs_root


user = user_fixture("a")


def cli(*args, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def install(stage, *args):
    return cli("install-hook", "--root", stage / "root", "--nccl-conf", "--dry-run", *args)


def test_loader_and_interpreter_variables_are_never_installed(stage):
    prof = stage / "profile.env"
    prof.write_text("# commdiag-profile 1\nNCCL_PROTO=LL\nLD_PRELOAD=/home/u/evil.so\n")
    cp = install(stage, "--profile", prof)
    assert cp.returncode == 2 and "LD_PRELOAD chooses code that every process of the target runs" in words(cp.stderr)
    cp = install(stage, "--set", "PYTHONPATH=/home/u")
    assert cp.returncode == 2 and "PYTHONPATH chooses code" in words(cp.stderr), cp.stderr
    for name in ("LD_LIBRARY_PATH", "GCONV_PATH", "PYTHONHOME", "MALLOC_CONF"):
        with pytest.raises(CommdiagError, match=f"{name} chooses code"):
            allowlist.check({name: "/home/u"}, system_wide=False)
    with pytest.raises(CommdiagError, match="FOO is not an NCCL setting"):
        allowlist.check({"FOO": "1"}, system_wide=False)
    assert not (stage / "root").exists() or not list((stage / "root").rglob("nccl.conf"))


def test_a_file_value_must_be_roots_and_files_nccl_writes_are_refused_system_wide(stage, user):
    name, uid, gid = user
    theirs = stage / "root" / "home" / name  # under --root: where the target system has /home/NAME
    theirs.mkdir(parents=True)
    (theirs / "evil.so").write_bytes(b"\x7fELF")
    give(theirs, uid, gid)
    cp = install(stage, "--set", f"NCCL_NET_PLUGIN=/home/{name}/evil.so")
    said = words(cp.stderr)
    assert cp.returncode == 2 and f"{theirs} is owned by uid {uid} ({name})" in said, said
    assert "every NCCL process would load or read a file that user can replace" in said
    cp = install(stage, "--set", "NCCL_DEBUG_FILE=/etc/shadow")
    assert cp.returncode == 2 and "would create or overwrite that file" in words(cp.stderr), cp.stderr
    with pytest.raises(CommdiagError, match="must be an absolute, normalized path"):
        allowlist.check({"NCCL_TOPO_FILE": "topo.xml"}, system_wide=False)  # relative: the service's folder decides
    # root's own file (looked up under --root, where the target will have it) and a plugin by name are fine
    lib = stage / "root" / "opt" / "nccl" / "libnccl-tuner-x.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    cp = install(stage, "--set", "NCCL_PROTO=LL", "--set", "NCCL_TUNER_PLUGIN=/opt/nccl/libnccl-tuner-x.so",
                 "--set", "NCCL_NET_PLUGIN=none")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    first = words("\n".join(cp.stdout.splitlines()[1:3]))  # right below the plan's first line
    assert first.startswith("names a file: NCCL_TUNER_PLUGIN=/opt/nccl/libnccl-tuner-x.so (every NCCL process "
                            "loads or reads this file)"), cp.stdout
    # a root-owned file in a folder the user can write is hers to replace
    os.chown(lib.parent, uid, gid)
    with pytest.raises(CommdiagError, match=f"{lib.parent} is owned by uid {uid}"):
        allowlist.check({"NCCL_TUNER_PLUGIN": "/opt/nccl/libnccl-tuner-x.so"}, system_wide=False, root=str(stage / "root"))


def test_the_rule_in_one_place():
    with pytest.raises(CommdiagError, match="PYTHONSTARTUP chooses code"):
        allowlist.check({"PYTHONSTARTUP": "/x"}, system_wide=False)
    with pytest.raises(CommdiagError, match="NCCL_GRAPH_DUMP_FILE"):
        allowlist.check({"NCCL_GRAPH_DUMP_FILE": "/tmp/g.xml"}, system_wide=True)
    with pytest.raises(CommdiagError, match="is not an integer"):
        allowlist.check({"NVSHMEM_DISABLE_NVLS": "yes"}, system_wide=True)
    allowlist.check({"NCCL_PROTO": "LL", "NVSHMEM_DISABLE_NVLS": "1", "NCCL_TUNER_PLUGIN": "/var/lib/x.so"},
                    system_wide=True, own={"NCCL_TUNER_PLUGIN": "/var/lib/x.so"})  # --tuner's own, made root's
    assert allowlist.kind("NCCL_CONF_FILE") == "reads" and allowlist.kind("NCCL_DEBUG_FILE") == "writes"


def test_ab_config_as_root_follows_the_install_rule(stage):
    prof = stage / "seed.env"
    prof.write_text("# commdiag-profile 1\nLD_PRELOAD=/home/u/evil.so\n")
    cp = cli("ab", "--config", f"seed={prof}", "--metric", "t:higher:t=(\\d+)", "--", sys.executable, "-c", "print(1)")
    assert cp.returncode == 2 and f"ab --config seed={prof}: LD_PRELOAD chooses code" in words(cp.stderr), cp.stderr
