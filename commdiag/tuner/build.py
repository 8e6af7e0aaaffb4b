"""Building commdiag's tuner plugin on the user's machine with the system C compiler.

Owns: compiling ``commdiag_tuner.c`` (shipped as package data beside this file) into
``OUT_DIR/libnccl-tuner-commdiag.so`` and checking that the result exports the tuner symbols
NCCL looks for.  Writes that one file, atomically (a temporary file in OUT_DIR, renamed over
the target, through the one writer, atomic.py): a process that already has the old library loaded
keeps its mapping intact, where writing in place would change code under a running NCCL.  The
compiler writes into a private 0700 folder; the result is opened once and checked (dlopen), read
and copied through that one descriptor, so nobody can put another library in its place between the
link and the load (as root, a folder another user can change is refused for --out, and the default
--out, the current folder, is refused).

Which compiler: ``--cc`` when given; otherwise, as root, ``cc`` found on the fixed
``SAFE_PATH`` and run with an environment of only that PATH (under ``sudo -E``, ``$CC``,
``$PATH``, ``COMPILER_PATH`` or ``GCC_EXEC_PREFIX`` are the invoking user's, and each chooses a
program the compiler runs); as anyone else ``$CC`` or ``cc`` on ``$PATH``, in their environment.
No ``CFLAGS`` are read from the environment: the flags are ``CFLAGS`` below.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
import shlex
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import procs
from ..errors import CommdiagError, terminal_safe

LIBRARY_NAME = "libnccl-tuner-commdiag.so"
SOURCE = Path(__file__).resolve().parent / "commdiag_tuner.c"
HEADER = SOURCE.parent / "commdiag_tuner_api.h"
# Newest first: the symbol each NCCL release looks for first is in commdiag_tuner_api.h.
SYMBOLS = ("ncclTunerPlugin_v6", "ncclTunerPlugin_v5", "ncclTunerPlugin_v4", "ncclTunerPlugin_v3",
           "ncclTunerPlugin_v2")
# -fvisibility=hidden: only the five plugin structs and commdiag_tuner_check are exported.
# -std=c99: the source is C99; older compilers (gcc < 5) default to gnu89 and would refuse it.
# No -Werror on users' machines: a newer compiler's new warning must not refuse a build that works.
# The tests build with warnings as errors (werror=True), so the source stays warning-free here.
CFLAGS = ("-std=c99", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra")
# A compile of one 600-line file takes well under a second; a compiler stuck for two minutes is broken.
COMPILE_TIMEOUT_S = 120
# NCCL copies NCCL_TUNER_PLUGIN into a 255-byte buffer (MAX_STR_LEN, src/plugin/plugin_open.cc) and
# would dlopen a truncated path.
NCCL_MAX_PLUGIN_PATH = 254
# Where root looks for the compiler, and the only PATH the compiler then has: the distribution's
# own directories (not /usr/local, group-writable on some systems).
SAFE_PATH = "/usr/bin:/bin"


@dataclass(frozen=True)
class BuildResult:
    library: Path
    compiler: str
    symbols: tuple[str, ...]

    def env(self, rules: Path | None = None) -> dict[str, str]:
        """The variables a process needs to load the plugin (absolute paths)."""
        return {"NCCL_TUNER_PLUGIN": str(self.library),
                "NCCL_TUNER_CONFIG_FILE": str(Path(rules).resolve()) if rules else "<rules file, docs/tuner.md>"}

    def to_json(self, rules: Path | None = None) -> dict:
        return {"format": "commdiag-tuner-build", "version": 1, "library": str(self.library),
                "compiler": self.compiler, "symbols": list(self.symbols), "env": self.env(rules)}


def _as_root() -> bool:
    return os.geteuid() == 0


def find_compiler(cc: str | None = None) -> list[str]:
    """The compiler's argv: ``cc`` (``--cc``, split like a shell would) when given, else as root
    ``cc`` on SAFE_PATH, else ``$CC`` or ``cc`` on PATH; a CommdiagError if there is none."""
    root = _as_root()
    if cc is not None:
        argv = shlex.split(cc) or ["cc"]
    else:
        argv = ["cc"] if root else (shlex.split(os.environ.get("CC", "")) or ["cc"])
    path = shutil.which(argv[0], path=SAFE_PATH if root else None)
    if path is None:
        where = f"PATH ({SAFE_PATH}: as root commdiag ignores $PATH and $CC)" if root else "PATH"
        raise CommdiagError(
            f"no C compiler: '{terminal_safe(argv[0])}' is not on {where} (install one: Debian/Ubuntu "
            "'apt-get install gcc', RHEL/Fedora 'dnf install gcc'; or give --cc PATH)")
    return [path, *argv[1:]]


def compiler_env() -> dict | None:
    """The compiler's environment: as root only SAFE_PATH (the compiler finds as, ld and cc1
    through PATH, COMPILER_PATH and GCC_EXEC_PREFIX); otherwise the caller's (None)."""
    return {"PATH": SAFE_PATH, "LC_ALL": "C"} if _as_root() else None


def check_plugin_path(path: str, hint: str) -> None:
    """Refuse a library path NCCL would truncate (its 255-byte NCCL_TUNER_PLUGIN buffer)."""
    if len(path) > NCCL_MAX_PLUGIN_PATH:
        raise CommdiagError(f"{terminal_safe(path)}: path longer than {NCCL_MAX_PLUGIN_PATH} characters; NCCL would "
                            f"load a truncated NCCL_TUNER_PLUGIN ({hint})")


def build(out_dir: str | Path | None = None, werror: bool = False, cc: str | None = None) -> Path:
    """Compile the plugin into ``out_dir`` (created if missing); returns the library's absolute path."""
    return build_result(out_dir, werror, cc).library


def default_out() -> Path:
    """``tuner build``'s folder without ``--out``: the current one, but never as root (a folder root
    happens to be in is no place to leave a library every NCCL process may load)."""
    if _as_root():
        raise CommdiagError("as root, give --out DIR (a folder root owns) for the library: commdiag does not "
                            "build into the current folder as root")
    return Path(".")


def build_result(out_dir: str | Path | None = None, werror: bool = False, cc: str | None = None) -> BuildResult:
    """Compile (``compile_bytes``) and write the library into ``out_dir`` through the one writer:
    the folder made without following links, and, as root, one no other user can change (the library
    is loaded into every NCCL process that names it)."""
    from .. import atomic, ownership

    out_dir = Path(os.path.abspath(Path(out_dir if out_dir is not None else default_out()).expanduser()))
    target = out_dir / LIBRARY_NAME
    check_plugin_path(str(target), "choose a shorter --out")
    if _as_root():  # before anything is made there: a user's folder, or a link she controls, is refused
        found = ownership.first_finding(str(target))
        if found is not None:
            raise CommdiagError(f"{out_dir}: as root, commdiag builds the tuner library only into a folder no "
                                f"other user can change, and {found.path} is {found.why}; every NCCL process "
                                "naming the library would load what that user puts there. Give --out DIR "
                                "root owns")
    data, compiler, symbols = compile_bytes(werror, cc)
    atomic.make_dirs(out_dir)
    atomic.check_target(target)  # refuses a symlink, a device, a directory where the library goes
    atomic.write_bytes(target, data, mode=0o755)
    return BuildResult(Path(atomic.real_path(str(target))), " ".join(compiler), symbols)


def _private_folder() -> str:
    """A new 0700 folder for the compiler's output (and its working folder), where procs keeps
    scratch folders: as root never under a TMPDIR another user can change (she could swap the folder
    between link and load)."""
    return tempfile.mkdtemp(prefix="commdiag-tuner-", dir=procs.scratch_root())


def compile_bytes(werror: bool = False, cc: str | None = None) -> tuple[bytes, list[str], tuple[str, ...]]:
    """The plugin compiled in a private folder: (bytes, compiler argv, exported symbols).

    The compiler's output is opened once, without following a link, and everything after that is done
    on that descriptor: the symbol check dlopens ``/proc/self/fd/N`` (the very file opened, not a path
    someone could rename another library over between link and load), and the bytes returned are read
    from it.  Nothing is chmod-ed by path; the writer gives the installed copy its mode."""
    compiler = find_compiler(cc)
    for f in (SOURCE, HEADER):
        if not f.is_file():
            raise CommdiagError(f"{f}: missing from the commdiag package (reinstall commdiag)")
    folder = _private_folder()
    try:
        out = os.path.join(folder, LIBRARY_NAME)
        argv = [*compiler, *CFLAGS, *(("-Werror",) if werror else ()), "-o", out, str(SOURCE)]
        try:  # procs: the compiler's whole group (cc1, as, ld) ends at the deadline, not cc alone
            proc = procs.run(argv, env=compiler_env(), cwd=folder, deadline_s=COMPILE_TIMEOUT_S)
        except OSError as e:
            raise CommdiagError(f"{compiler[0]}: cannot run: {e.strerror or e}") from None
        if proc.timed_out:
            raise CommdiagError(f"{compiler[0]}: no result after {COMPILE_TIMEOUT_S} s compiling {SOURCE}")
        if proc.exit_code != 0:
            detail = terminal_safe((proc.stderr or proc.stdout).decode(errors="replace").strip())[-2000:]
            raise CommdiagError(f"{compiler[0]} failed (exit {proc.exit_code}) compiling {SOURCE}:\n{detail}")
        try:
            fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise CommdiagError(f"{out}: the compiler left no library: {e.strerror or e}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CommdiagError(f"{out}: the compiler's output is not a regular file")
            symbols = exported_symbols(Path(f"/proc/self/fd/{fd}"))
            missing = [s for s in SYMBOLS if s not in symbols]
            if missing:
                raise CommdiagError(f"{out}: built, but does not export {', '.join(missing)}")
            data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return data, compiler, symbols


def exported_symbols(library: Path) -> tuple[str, ...]:
    """Which of ``SYMBOLS`` the library exports (dlopen + dlsym, as NCCL does), newest first."""
    try:
        lib = ctypes.CDLL(str(library), mode=os.RTLD_LOCAL)
    except OSError as e:
        raise CommdiagError(f"{library}: does not load: {e}") from None
    found = []
    try:
        for name in SYMBOLS:
            try:
                ctypes.c_void_p.in_dll(lib, name)
                found.append(name)
            except ValueError:
                pass
    finally:
        # unloaded again: the loader knows a library by the name it was opened with, and the next
        # check's /proc/self/fd/N may be the same name for another file
        _ctypes.dlclose(lib._handle)
    return tuple(found)


def render(result: BuildResult, rules: Path | None = None, n_rules: int | None = None) -> str:
    """The text ``commdiag tuner build`` prints: the library, then the lines to put in every rank's environment."""
    short = " ".join(s.rsplit("_", 1)[1] for s in result.symbols)
    out = [f"built {result.library}", f"  compiler {result.compiler}; exports ncclTunerPlugin_{{{short}}}"]
    if rules is not None:
        out.append(f"  rules {Path(rules).resolve()}: {n_rules} rule{'s' if n_rules != 1 else ''}, as the plugin reads it")
    out.append("Set in every rank's environment:")
    out += [f"  {k}={shlex.quote(v) if rules or k != 'NCCL_TUNER_CONFIG_FILE' else v}"
            for k, v in result.env(rules).items()]
    out.append("To see it load and which rule fired (docs/tuner.md, 'Proof'):")
    out.append("  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING")
    return "\n".join(out)
