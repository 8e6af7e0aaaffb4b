"""What root reads (#30 items 8 and 10, and the reading rule): one walker (commdiag/ownership.py)
decides whether another user could change a path, POSIX ACLs included; one reader
(commdiag/readfile.py) reads profiles, specs, rules, run folders and recordings: a regular file only,
never a FIFO's wait or /dev/zero's endless read, and as root nothing another user can change unless
``--allow-user-files`` says so.  Real throwaway users (useradd), real FIFOs and links in /tmp.
No torch: runs under Debian's python3.11 too (.ci/run)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag import ownership, readfile
from commdiag.environment import trust
from commdiag.errors import CommdiagError
from commdiag.formats import profile, spec as spec_mod
from commdiag.install import hooktext
from commdiag.p2p import result as p2p_result
from commdiag.tuner import rules

from conftest import REPO, words
from users import (  # noqa: F401 (stage, reader_refuses_others: fixtures)
    as_user, give, needs_root, reader_refuses_others, stage, staging, throwaway_user, user_fixture)

PROFILE = "# commdiag-profile 1\nNCCL_PROTO=LL\n"


user = user_fixture("r")


def cli(*args, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


class _Deadline:
    """A read that blocks (a FIFO without a writer) fails the test instead of hanging it."""

    def __enter__(self):
        signal.signal(signal.SIGALRM, self._fire)
        signal.alarm(5)

    def __exit__(self, *exc):
        signal.alarm(0)

    @staticmethod
    def _fire(*_):
        raise TimeoutError("the read blocked")


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


# --------------------------------------------------------------------------- item 8: the walker

@needs_root
def test_a_root_group_write_bit_and_an_acl_grant_are_findings(stage, user):
    name, uid, gid = user
    exe = stage / "venv" / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    os.chmod(exe, 0o775)  # root:root g+w: how `setfacl -m u:deploy:rwx` looks in the mode bits
    assert any(f.path == str(exe) and "writable by group 0" in f.why for f in trust.interpreter_findings(str(exe)))
    os.chmod(exe, 0o755)
    assert trust.interpreter_findings(str(exe)) == []
    # a default ACL on a folder leaves its mode bits alone: files made there later are the user's to edit
    folder = stage / "venv" / "lib"
    folder.mkdir()
    acl = _acl((0x01, 7, 0xFFFFFFFF), (0x02, 7, uid), (0x04, 5, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF),
               (0x20, 5, 0xFFFFFFFF))
    os.setxattr(folder, ownership.ACL_DEFAULT, acl)
    assert stat_mode(folder) == 0o755
    found = ownership.first_finding(str(folder))
    assert found is not None and f"writable by user {uid} ({name}) (POSIX default ACL)" in found.why
    # the mask is what passes: a named entry with w behind a mask without it writes nothing
    assert ownership.acl_writers(_acl((0x02, 7, uid), (0x10, 5, 0xFFFFFFFF))) == []
    assert ownership.acl_writers(_acl((0x02, 6, uid), (0x08, 2, 1234))) == [("user", uid), ("group", 1234)]
    # what the user can really do with it: edit the next file root makes there
    (folder / "site.py").write_text("# root's\n")
    assert as_user(name, "sh", "-c", f"echo planted >> {folder / 'site.py'}").returncode == 0
    assert f"{folder / 'site.py'}: writable by user {uid} ({name}) (POSIX ACL)" in [
        f"{f.path}: {f.why}" for f in ownership.findings(str(folder / "site.py"))]


def stat_mode(p: Path) -> int:
    return os.stat(p).st_mode & 0o7777


# --------------------------------------------------------------------------- the reading rule

@needs_root
def test_as_root_a_file_another_user_can_change_is_refused_unless_allowed(stage, user):
    name, uid, gid = user
    own = give(stage / "theirs", uid, gid) if (stage / "theirs").mkdir() is None else None
    (own / "profile.env").write_text(PROFILE)
    (own / "spec.yaml").write_text("name: x\n")
    (own / "rules.txt").write_text("# commdiag-tuner-rules 1\n")
    (own / "p2p.json").write_text("{}")
    give(own, uid, gid)
    with pytest.raises(CommdiagError, match=r"cannot read profile: as root, commdiag reads a profile only where no "
                                            r"other user can change it, and .*theirs is owned by uid"):
        profile.load(own / "profile.env")
    with pytest.raises(CommdiagError, match="--allow-user-files"):
        spec_mod.load_spec(own / "spec.yaml")
    with pytest.raises(CommdiagError, match="as root, commdiag reads a rules file only"):
        rules.load(own / "rules.txt")
    with pytest.raises(CommdiagError, match="as root, commdiag reads a p2p result only"):
        p2p_result.load(own / "p2p.json")
    # a root-owned file the user can swap, because she owns the folder above it, is hers as well
    os.lchown(own / "profile.env", 0, 0)
    with pytest.raises(CommdiagError, match="owned by uid"):
        profile.load(own / "profile.env")
    # a link the user made, in a folder of root's, to a file of root's: she can point it elsewhere
    (stage / "mine.env").write_text(PROFILE)
    (own / "link.env").symlink_to(stage / "mine.env")
    os.lchown(own / "link.env", uid, gid)
    with pytest.raises(CommdiagError, match="owned by uid"):
        profile.load(own / "link.env")
    assert profile.load(stage / "mine.env").settings == {"NCCL_PROTO": "LL"}  # root's own: read
    readfile.allow_others(True)
    assert profile.load(own / "profile.env").settings == {"NCCL_PROTO": "LL"}


@needs_root
def test_install_hook_from_a_users_run_folder_needs_the_option(stage, user):
    name, uid, gid = user
    run = stage / "run"
    run.mkdir()
    (run / "profile.env").write_text(PROFILE)
    give(run, uid, gid)
    root = stage / "root"
    cp = cli("install-hook", "--from", run, "--root", root, "--nccl-conf", "--dry-run")
    said = words(cp.stderr)
    assert cp.returncode == 2 and "as root, commdiag reads a profile only where no other user can change it" in said
    assert "--allow-user-files" in said and f"owned by uid {uid} ({name})" in said, said
    cp = cli("--allow-user-files", "install-hook", "--from", run, "--root", root, "--nccl-conf", "--dry-run")
    assert cp.returncode == 0 and "NCCL_PROTO=LL" in cp.stdout, cp.stdout + cp.stderr
    assert not root.exists() or not list(root.rglob("nccl.conf"))


# --------------------------------------------------------------------------- item 10: FIFOs, /dev/zero

def test_no_reader_of_a_named_file_waits_on_a_fifo_or_reads_dev_zero(tmp_path):
    from commdiag.ab import spec as ab_spec
    from commdiag.cli import _load_readings
    from commdiag.environment import envcheck
    from commdiag.install import hook

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "profile.env")
    readers = {
        "--profile": lambda p: profile.load(p),
        "install-hook --from": lambda p: hook.resolve_settings(from_dir=run if p == fifo else None, profile=
                                                             None if p == fifo else p),
        "check-env --profile": lambda p: envcheck.check_env(profile=p),
        "sweep/step spec": lambda p: spec_mod.load_spec(p),
        "ab spec": lambda p: ab_spec.load(p),
        "p2p --from": lambda p: p2p_result.load(p),
        "--nvml-replay": lambda p: _load_readings(p),
        "--tuner rules": lambda p: rules.load(p),
    }
    for what, read in readers.items():
        for p in (fifo, zero):
            with _Deadline():
                with pytest.raises(CommdiagError, match="not a regular file") as e:
                    read(p)
            assert str(p if what != "install-hook --from" or p == zero else run / "profile.env") in str(e.value), what
    # check_env() in a server started beside a FIFO named like the hook (its folder is sys.path[0])
    os.mkfifo(tmp_path / "commdiag_nccl_hook.py")
    with _Deadline():
        assert hooktext.installed_settings([str(tmp_path)]) == {}
    # and nccl.conf named by NCCL_CONF_FILE: a FIFO there is skipped, not waited on
    with _Deadline():
        files = envcheck.nccl_conf_files(env={"NCCL_CONF_FILE": str(fifo)})
    assert files[0].path == str(fifo) and not files[0].exists
