"""A real throwaway user for the root-side safety tests: made with useradd, removed with userdel.

The tests run as root and stage what that user owns in a fresh 0755 folder under /tmp (pytest's own
tmp folder is 0700 root: the user could not reach anything there); ``as_user`` runs a command as
them with runuser, the way an attacker on the box would act."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
                                reason="needs root, useradd and runuser (a real second user)")


@contextlib.contextmanager
def throwaway_user(tag: str = "t"):
    """(name, uid, gid) of a new user with no home and no login shell; removed afterwards."""
    name = f"cdsafe{tag}{os.getpid() % 100000}{os.urandom(2).hex()}"[:31]
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield name, pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", "-f", name], capture_output=True)


@contextlib.contextmanager
def staging():
    """A fresh 0755 root-owned folder under /tmp (reachable by every user); removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="commdiag-safety-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def give(path: Path, uid: int, gid: int) -> Path:
    """chown ``path`` and everything below it (links themselves) to uid:gid."""
    for dirpath, dirs, files in os.walk(path):
        for n in dirs + files:
            os.lchown(os.path.join(dirpath, n), uid, gid)
    os.lchown(path, uid, gid)
    return path


def as_user(name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", name, "--", *argv], capture_output=True, text=True, timeout=timeout)


# The fixtures every root-side safety file uses, in one place: a module imports them by name (pytest finds
# a fixture in the test module's namespace), ``user = user_fixture("r")`` names its throwaway user.

def user_fixture(tag: str):
    """A module-scoped fixture: one throwaway user (name tagged ``tag``) for the module's tests."""
    @pytest.fixture(scope="module")
    def user():
        if os.geteuid() != 0:
            pytest.skip("needs root")
        with throwaway_user(tag) as u:
            yield u
    return user


@pytest.fixture
def stage():
    """A fresh 0755 staging folder under /tmp (``staging``)."""
    with staging() as d:
        yield d


@pytest.fixture(autouse=True)
def reader_refuses_others():
    """Each test starts and ends with the one reader refusing other users' files (the default, without
    --allow-user-files), whatever a test switched on."""
    from commdiag import readfile

    allow = getattr(readfile, "allow_others", lambda on: None)  # (absent before the rule: everything read)
    allow(False)
    yield
    allow(False)
