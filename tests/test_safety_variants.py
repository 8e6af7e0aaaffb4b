"""Variants of #30's thirteen attacks (the adversarial pass its "done when" asks for): a local user
against commdiag run as root on files and folders she owns or can write.  Real throwaway users
(useradd), real links in a staged /tmp folder.  A race (her swap between commdiag's check and its use)
is made deterministic by doing her swap at that very moment, from inside the check (the walker), the
way a loop of hers wins it sooner or later.  No torch: runs under Debian's python3.11 too (.ci/run).

Found and fixed here (each test fails on the main before the fix):

* ``..`` after a link of hers: the walker normalized ``..`` by the letters (``/tmp/L/../x`` walked as
  ``/tmp/x``, which does not exist: no finding), while the kernel opens ``L``'s target's parent's ``x``,
  her file.  The walker now resolves ``..`` after links, as the kernel does.
  (``test_dotdot_after_her_link_is_walked_as_the_kernel_opens_it``)
* The reader checked the path after opening it: she renames her file away while the walker looks
  (a missing component is no finding) and back after; root read her bytes through the descriptor.
  The reader now also judges the opened file itself (owner, mode, ACL, from the descriptor) and
  requires the path, after the walk, to still name that very file.
  (``test_a_file_renamed_away_during_the_walk_is_not_read``)
* The writer, as root, resolved links *after* the walk even where the walk had findings (her run
  folder) and no links: she swaps her run folder for a link to a folder of root's between the walk
  and the resolution, and root wrote report.html (or made folders) there.  As root, a path with a
  finding is now not resolved at all: it is walked as named, without following a link, so a link
  planted later stops the write.  (``test_a_swap_between_the_walk_and_the_write_is_refused``,
  ``test_make_dirs_through_a_folder_swapped_after_the_walk_is_refused``)
* The writer, as root, walked the path and then resolved its links a second time: a name missing
  during the walk (``/tmp/new``: nothing to judge) she then makes a link to a folder of root's, and
  ``make_dirs``/``sweep --out /tmp/new/run`` made ``run`` there.  The walker now returns the
  resolution it judged, and the writer uses exactly that (a later link stops the O_NOFOLLOW walk).
  (``test_a_link_planted_at_a_missing_name_after_the_walk_is_not_followed``)
* A bare program name (hosts' ``node_command`` ``ssh``, Slurm's ``srun``/``scontrol``) was looked up
  on PATH as root: her folder on PATH, or an empty or ``.`` entry with her folder as the working
  folder, ran her program as uid 0.  The one supervisor (``procs.start``) and Slurm's tool lookup now
  use ``procs.which``: as root only absolute PATH folders nobody else can change.
  (``test_as_root_a_bare_program_name_is_never_found_in_her_folder_or_cwd``,
  ``test_as_root_slurm_tools_are_not_taken_from_her_path``)
* The install state folder (``/var/lib/commdiag``, its ``tuner/`` and ``saved/``) was checked only for
  o+w: with an ACL grant or her group's g+w there, ``install-hook --tuner`` installed the library every
  NCCL process loads where she can replace it, and an undo would write back saved originals she
  replaced.  As root the state folder is walked (``hookstate.state_dir``).
  (``test_as_root_the_install_state_folder_must_be_roots_alone``)
* Every reader (the one reader, ``commdiag trace``'s, ``explain --log``'s) refused a FIFO or device
  only after opening it (``O_NONBLOCK``, then fstat): the driver's open had run (``/dev/watchdog``
  arms a reboot, a tape rewinds, a FIFO's blocked writer is released), through a link in her run
  folder or a log glob in her folder.  ``readfile.open_regular`` opens the name ``O_PATH`` first and
  reads only a regular file, through that descriptor; trace and logread use it.
  (``test_no_reader_opens_what_is_not_a_regular_file``)
* ``commdiag trace`` printed a trace's record_param_comms ``dtype`` and collective name as they were:
  a line break there printed a fake "installed ... verify: OK" line (cli._echo keeps line breaks).
  The trace reader stores every string as one inert line.
  (``test_a_trace_cannot_print_a_line_of_its_own``)
* ``check-env --nodes`` kept srun's log, which it reads back and prints as every node's verdict, in a
  plain ``tempfile.TemporaryDirectory()``: under ``sudo -E`` with her TMPDIR she renames root's folder
  and puts her own there (a forged "ok" per node; srun's output written into her folder).  Every
  temporary folder now comes from the one scratch root (``procs.private_folder``/``scratch_root``).
  (``test_every_scratch_folder_is_under_the_one_scratch_root``)

Found and not fixed (low):

* ``report``'s clean-up of stale ``profile-*.env`` (analyse/report.py, ``publish``) reads them with
  ``read_text`` after an ``is_file`` check and unlinks them by path: in a run folder whose owner can
  swap it, a FIFO put there between the check and the read would block, and a folder swapped for a link
  would have root unlink a file with commdiag's profile header wherever it points.  As root it is
  reached only with ``--allow-user-files`` (a run folder of another user's is refused before); the fix
  is the one reader and ``atomic.remove_tree`` there (not done here: #30's safety owner's file).

Tried and held (no test: each is already covered by tests/test_safety_*.py or cannot happen):

* install-hook file-valued settings with ``..``, a relative path, or a link (``NCCL_TUNER_PLUGIN=
  /usr/../home/u/x.so``): refused, ``allowlist._file_error`` wants an absolute, normalized path and
  walks links hop by hop.
* A plugin by bare name (``NCCL_NET_PLUGIN=..``, ``evil.so``): no slash, so dlopen searches only the
  loader's folders, never the working folder.
* Loader/interpreter names in lower case or with a prefix (``ld_preload``, ``XLD_PRELOAD``): not
  ``NCCL_*``, refused as "not an NCCL setting".
* A hardlink of a root-owned file into her folder: fs.protected_hardlinks=1 here refuses it; her own
  hardlinked file is owned by her (a finding either way).
* A group-writable folder of her group, a root-owned ``g+w`` folder (gid 0), an access or default ACL
  on a parent folder: findings of the walker (test_safety_read covers the ACL bytes).
* A FIFO, ``/dev/zero`` or a huge file at ``explain --log`` (nccl/logread.py) and ``commdiag trace``
  (trace/reader.py): both open ``O_NONBLOCK`` and refuse non-regular files; logread stops at
  MAX_BYTES, the trace reader bounds each value (MAX_EVENT).  They read without the owner check by
  design (docs/safety.md: they only print).
* Control characters (not line breaks) in trace names, log lines, host names: every line goes
  through cli._echo, which escapes them (errors.terminal_safe); an ``explain --log`` record is one line
  of the log (split at LF; CR escaped).  Host names of ``commdiag nodes`` come from Slurm and
  commdiag's own workers, not from a user's file.
* A default ACL (``setfacl -d -m u:her:rwx``) on a folder above a profile: refused by the walker
  (checked by hand with check-env --profile); a group-writable folder of her group: a finding.
* A spec's ``base_env``/configs, ``--set`` or ``ab --config`` setting LD_PRELOAD/PYTHONPATH/
  NCCL_NET_PLUGIN for a sweep, step, ab or explain run as root: the spec or run folder must be root's
  (readfile), so it is root's own choice; ``--allow-user-files`` says the owner then chooses what root
  "reads, installs or runs"; ``ab --config`` profiles go through the install allowlist.
* HOME/XDG_STATE_HOME under ``sudo -E``: as root the state folder is /var/lib/commdiag whatever they
  say; TMPDIR: every scratch folder now goes through ``procs.scratch_root`` (above).
* Her ``.pth`` in a venv commdiag probes: the probe runs ``-S`` and the trust walker decides whom a
  normal start runs as (test_safety_probe / test_safety_children cover it).
* A folder of hers on an install target (a drop-in folder, /etc/nccl.conf with her ACL): writing a file
  there gives her nothing she did not have (she could write her own drop-in already); only the state
  folder, whose files commdiag exempts from the file-value rule, mattered (fixed above).
* ``--python /tmp/L/../python3``: trust normalizes the name once and both walks and runs that very
  string, so the lexical reading is consistent (no gap between what is judged and what runs).
* ``launches/`` swapped for a link inside her run folder after the check: launches are made and
  written through folder descriptors (atomic.make_dirs / folder_fd), ``O_NOFOLLOW`` per component;
  ``remove_tree`` uses rmtree's descriptor walk (a link inside is unlinked, not followed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commdiag import atomic, ownership, readfile
from commdiag.errors import CommdiagError
from commdiag.formats import profile

from users import (  # noqa: F401 (stage, reader_refuses_others: fixtures)
    give, needs_root, reader_refuses_others, stage, staging, throwaway_user, user_fixture)

PROFILE = "# commdiag-profile 1\nNCCL_PROTO=LL\n"


user = user_fixture("v")


def _tmp_like(stage: Path) -> Path:
    """A root-owned sticky world-writable folder, as /tmp is: she may put her own names there."""
    w = stage / "tmp"
    w.mkdir()
    os.chmod(w, 0o1777)
    return w


def _during_walk(monkeypatch, swap, undo=None):
    """Run ``swap`` (her move) when the walker starts, ``undo`` when it ends: the race won."""
    real = ownership.Walker.path

    def path(self, p, depth=0):
        if depth == 0:
            swap()
        try:
            return real(self, p, depth)
        finally:
            if depth == 0 and undo is not None:
                undo()

    monkeypatch.setattr(ownership.Walker, "path", path)


@needs_root
def test_dotdot_after_her_link_is_walked_as_the_kernel_opens_it(stage, user):
    name, uid, gid = user
    tmp = _tmp_like(stage)
    home = stage / "home"
    (home / "sub").mkdir(parents=True)
    (home / "x.env").write_text(PROFILE)
    give(home, uid, gid)
    link = tmp / "L"
    link.symlink_to(home / "sub")
    os.lchown(link, uid, gid)
    sneaky = f"{tmp}/L/../x.env"  # the kernel: home/x.env (hers); by the letters: tmp/x.env (absent)
    assert open(sneaky).read() == PROFILE
    assert ownership.first_finding(sneaky) is not None
    with pytest.raises(CommdiagError, match="owned by uid"):
        profile.load(sneaky)


@needs_root
def test_a_file_renamed_away_during_the_walk_is_not_read(stage, user, monkeypatch):
    name, uid, gid = user
    tmp = _tmp_like(stage)
    mine = tmp / "x.env"
    mine.write_text(PROFILE)
    os.lchown(mine, uid, gid)
    away = tmp / "elsewhere"
    _during_walk(monkeypatch, lambda: os.rename(mine, away), lambda: os.rename(away, mine))
    with pytest.raises(CommdiagError, match="owned by uid"):
        profile.load(mine)


@needs_root
def test_a_swap_between_the_walk_and_the_write_is_refused(stage, user, monkeypatch):
    name, uid, gid = user
    home = stage / "home"
    (home / "run").mkdir(parents=True)
    give(home, uid, gid)
    target = stage / "roots"  # a folder of root's she wants report.html in
    target.mkdir()
    run = home / "run"

    def swap():  # after the walk saw her plain folder (a finding, but no link), before the write
        os.rename(run, home / "run.old")
        run.symlink_to(target)

    real = ownership.Walker.path

    def path(self, p, depth=0):
        try:
            return real(self, p, depth)
        finally:
            if depth == 0 and not run.is_symlink():
                swap()

    monkeypatch.setattr(ownership.Walker, "path", path)
    with pytest.raises(CommdiagError, match="symbolic link|changed"):
        atomic.write_text(run / "report.html", "<html></html>")
    assert not (target / "report.html").exists()


@needs_root
def test_make_dirs_through_a_folder_swapped_after_the_walk_is_refused(stage, user, monkeypatch):
    name, uid, gid = user
    home = stage / "home"
    (home / "out").mkdir(parents=True)
    give(home, uid, gid)
    target = stage / "roots"
    target.mkdir()
    out = home / "out"
    real = ownership.Walker.path

    def path(self, p, depth=0):
        try:
            return real(self, p, depth)
        finally:
            if depth == 0 and not out.is_symlink():
                os.rename(out, home / "out.old")
                out.symlink_to(target)

    monkeypatch.setattr(ownership.Walker, "path", path)
    with pytest.raises(CommdiagError, match="symbolic link|cannot create"):
        atomic.make_dirs(out / "launches" / "0001")
    assert not (target / "launches").exists()


@needs_root
def test_her_folder_without_links_is_still_written(stage, user):
    """The fix does not refuse what was right: root writes report.html into her plain run folder."""
    name, uid, gid = user
    home = stage / "home"
    (home / "run").mkdir(parents=True)
    give(home, uid, gid)
    atomic.write_text(home / "run" / "report.html", "ok")
    atomic.make_dirs(home / "run" / "launches" / "0001")
    assert (home / "run" / "report.html").read_text() == "ok"
    assert (home / "run" / "launches" / "0001").is_dir()


def _calls(tree, names):
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "tempfile":
            yield node


def test_every_scratch_folder_is_under_the_one_scratch_root():
    """Under ``sudo -E`` with her TMPDIR, a temporary folder made in $TMPDIR (not through
    ``procs.scratch_root``) is one she can rename and replace: ``check-env --nodes`` kept srun's log,
    which it then reads and prints as every node's verdict, in ``tempfile.TemporaryDirectory()``.
    Every temporary folder or file of commdiag's is made with ``dir=procs.scratch_root()`` (or by
    ``procs.private_folder``)."""
    import ast

    from conftest import REPO

    bad = []
    for path in sorted((REPO / "commdiag").rglob("*.py")):
        if path.name == "procs.py" and path.parent.name == "commdiag":
            continue
        tree = ast.parse(path.read_text())
        for call in _calls(tree, {"TemporaryDirectory", "mkdtemp", "mkstemp", "NamedTemporaryFile",
                                  "TemporaryFile", "SpooledTemporaryFile", "gettempdir"}):
            ok = any(k.arg == "dir" and "scratch_root" in ast.unparse(k.value) for k in call.keywords)
            if not ok:
                bad.append(f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)}")
    assert bad == []


@needs_root
def test_a_link_planted_at_a_missing_name_after_the_walk_is_not_followed(stage, user, monkeypatch):
    """``sweep --out /tmp/new/run`` as root: the walk finds /tmp/new missing (no finding: nothing to
    change there yet); she then makes /tmp/new a link to a folder of root's.  Resolving the links again
    after the walk followed it, and root made ``run`` there."""
    name, uid, gid = user
    tmp = _tmp_like(stage)
    target = stage / "roots"
    target.mkdir()
    new = tmp / "new"
    real = ownership.Walker.path

    def path(self, p, depth=0):
        try:
            return real(self, p, depth)
        finally:
            if depth == 0 and not new.is_symlink():
                new.symlink_to(target)
                os.lchown(new, uid, gid)

    monkeypatch.setattr(ownership.Walker, "path", path)
    with pytest.raises(CommdiagError, match="symbolic link|cannot create"):
        atomic.make_dirs(new / "run")
    assert not (target / "run").exists()


def _her_program(folder: Path, name: str, uid: int, gid: int, proof: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    prog = folder / name
    prog.write_text(f"#!/bin/sh\nid -u > {proof}\n")
    os.chmod(prog, 0o755)
    give(folder, uid, gid)


@needs_root
@pytest.mark.parametrize("entry", ["her", "", "."])
def test_as_root_a_bare_program_name_is_never_found_in_her_folder_or_cwd(stage, user, entry):
    """A program started by a bare name (ab's and hosts' ``node_command`` ``ssh``, Slurm's ``srun``) is
    looked up on PATH; as root a PATH with her folder first, or with an empty or ``.`` entry (the
    working folder) and a working folder of hers, ran her program as uid 0.  The one supervisor now
    looks a bare name up as root only in PATH folders nobody else can change, absolute ones."""
    from commdiag import procs

    name, uid, gid = user
    her = stage / "home" / "bin"
    proof = stage / "ran-as"
    tool = "cdvariant-tool"
    _her_program(her, tool, uid, gid, proof)
    path = {"her": f"{her}:/usr/bin:/bin", "": ":/usr/bin:/bin", ".": ".:/usr/bin:/bin"}[entry]
    with pytest.raises(OSError, match="only root can change|not found"):
        procs.run([tool], env={"PATH": path}, cwd=her, deadline_s=10)
    assert not proof.exists()
    assert procs.which(tool, path) is None
    assert procs.which("sh", path) in ("/usr/bin/sh", "/bin/sh")  # root's own folders still found


@needs_root
def test_as_root_slurm_tools_are_not_taken_from_her_path(stage, user, monkeypatch):
    from commdiag.errors import CommdiagError
    from commdiag.measure import slurm

    name, uid, gid = user
    her = stage / "home" / "bin"
    _her_program(her, "scontrol", uid, gid, stage / "ran-as")
    monkeypatch.setenv("PATH", f"{her}:/usr/bin:/bin")
    try:
        found = slurm._tool("scontrol")
    except CommdiagError as e:  # no Slurm on this machine: not found, never hers
        assert "scontrol" in str(e)
    else:
        assert found in ("/usr/bin/scontrol", "/bin/scontrol")


def _install(*args, timeout=120):
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)


@needs_root
@pytest.mark.parametrize("how", ["acl-on-tuner", "group-on-state"])
def test_as_root_the_install_state_folder_must_be_roots_alone(stage, user, how):
    """``install-hook --tuner`` installs the library every NCCL process loads into the state folder's
    ``tuner/`` (exempt from the file-value rule: commdiag writes it root-owned), and the undo writes the
    saved originals back into /etc.  A folder there she can write (an ACL grant, her group's g+w) let her
    replace the library after the install (every NCCL process, root's services too, loads hers) or the
    saved originals before an undo.  As root the state folder, its tuner/ and saved/ are walked."""
    import shutil
    import subprocess

    name, uid, gid = user
    root = stage / "root"
    state = root / "var/lib/commdiag"
    (state / "tuner").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    for d in (root, root / "var", root / "var/lib", state, state / "tuner", root / "etc"):
        os.chmod(d, 0o755)
    rules = stage / "rules.txt"
    rules.write_bytes(b"# commdiag-tuner-rules 1\n"
                      b"coll=allreduce min_bytes=0 max_bytes=2097152 nranks=2 nnodes=1 algo=ring proto=ll\n")
    if how == "acl-on-tuner":
        if not shutil.which("setfacl"):
            pytest.skip("needs setfacl")
        subprocess.run(["setfacl", "-m", f"u:{name}:rwx", str(state / "tuner")], check=True)
        if not shutil.which("cc"):
            pytest.skip("needs cc (on the old code the install builds the library)")
        args = ["--root", root, "--tuner", rules, "--nccl-conf"]
    else:
        os.chown(state, 0, gid)
        os.chmod(state, 0o775)
        args = ["--root", root, "--nccl-conf", "--set", "NCCL_PROTO=LL"]
    cp = _install(*args)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "keeps its install state" in " ".join(cp.stderr.split())
    assert not (state / "tuner" / "libnccl-tuner-commdiag.so").exists()
    assert (root / "etc/nccl.conf").read_text() == "NCCL_DEBUG=WARN\n"


def _writer_released(fifo: Path, read) -> bool:
    """Whether ``read(fifo)`` opened the FIFO: a writer blocked in open(O_WRONLY) is released only by
    an open for reading.  (The way a device's driver sees an open: /dev/watchdog arms a reboot.)"""
    import threading

    opened = threading.Event()

    def writer():
        fd = os.open(fifo, os.O_WRONLY)  # blocks until someone opens the FIFO for reading
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        read(fifo)
    except Exception:
        pass
    released = opened.wait(0.3)
    if not released:  # let the writer go
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        opened.wait(5)
        os.close(fd)
    t.join(5)
    return released


@pytest.mark.parametrize("reader", ["readfile", "trace", "explain-log"])
def test_no_reader_opens_what_is_not_a_regular_file(tmp_path, reader):
    """Every reader refused a FIFO or a device only after opening it (``O_NONBLOCK``, then fstat): the
    driver's open had run by then.  Opening ``/dev/watchdog`` arms the machine's reboot, a tape device
    rewinds, a FIFO's waiting writer is released; a link to one in her run folder, or a log glob in her
    folder, made root do that.  The one reader's ``open_regular`` opens the name with ``O_PATH`` (no
    driver runs) and reads only a regular file, through that descriptor."""
    from commdiag.nccl import logread
    from commdiag.trace import reader as trace_reader

    read = {"readfile": lambda p: readfile.read_bytes(p, check_owner=False), "trace": trace_reader.read,
            "explain-log": logread.read}[reader]
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    assert not _writer_released(fifo, read)
    link = tmp_path / "link.log"
    link.symlink_to(fifo)
    assert not _writer_released(link, read)


def test_a_trace_cannot_print_a_line_of_its_own(tmp_path):
    """``commdiag trace`` printed the record_param_comms ``dtype`` and collective name of a trace as
    they were: a line break there printed a line of its own ("commdiag: installed ... verify: OK") on
    root's terminal (cli._echo escapes control characters but keeps line breaks, which its own messages
    need).  The trace reader keeps every string it stores as one inert line (errors.one_line)."""
    import gzip
    import json

    from commdiag import trace as trace_mod
    from commdiag.trace import render

    from conftest import REPO

    d = json.load(gzip.open(REPO / "tests/fixtures/traces/trace-eager-rank0.json.gz"))
    fake = "commdiag: installed NCCL_PROTO=LL ... verify: OK"
    for e in d["traceEvents"]:
        if e.get("name") == "record_param_comms":
            e["args"]["dtype"] = "BFloat16\n" + fake
            e["args"]["Collective name"] = "allreduce\r\x1b[2K" + fake
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    text = render.render(trace_mod.analyse_paths([str(path)]))
    assert fake in text  # still shown, as data
    assert not any(line.startswith(fake) or "\x1b" in line or "\r" in line for line in text.splitlines())


def test_the_old_profile_clean_up_reads_through_the_reader_and_removes_through_the_writer(tmp_path):
    """A run folder's stale profile-*.env is removed when the verdicts changed (analyse/report.py): a FIFO
    named like one is never opened (it would block the clean-up), a link named like one is removed as a
    link (its target stays), a file that is not commdiag's profile stays; a real stale profile goes.
    (Found by the review pass: the clean-up read after an is_file() check and unlinked by path.)"""
    import stat
    import threading

    from commdiag.analyse import report as report_mod

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "profile-decode.env")
    target = tmp_path / "elsewhere.env"
    target.write_text(profile.PROFILE_HEADER + "\nNCCL_PROTO=LL\n")
    (run / "profile-prefill.env").symlink_to(target)
    (run / "profile-x.env").write_text("not commdiag's\n")
    (run / "profile.env").write_text(profile.PROFILE_HEADER + "\nNCCL_PROTO=LL\n")
    done = threading.Event()
    threading.Thread(target=lambda: (report_mod._remove_stale_profiles(run, set()), done.set()), daemon=True).start()
    assert done.wait(20), "the clean-up blocked on a FIFO named like a profile"
    assert target.exists() and not os.path.lexists(run / "profile-prefill.env")
    assert (run / "profile-x.env").exists() and not (run / "profile.env").exists()
    assert stat.S_ISFIFO(os.lstat(run / "profile-decode.env").st_mode)
