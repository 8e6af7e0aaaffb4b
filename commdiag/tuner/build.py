"""Building commdiag's tuner plugin on the user's machine with the system C compiler.

Owns: compiling ``commdiag_tuner.c`` (shipped as package data beside this file) into
``OUT_DIR/libnccl-tuner-commdiag.so`` and checking that the result exports the tuner symbols
NCCL looks for.  Writes that one file, atomically (a temporary file in OUT_DIR, renamed over
the target): a process that already has the old library loaded keeps its mapping intact,
where writing in place would change code under a running NCCL.

Which compiler: ``--cc`` when given; otherwise, as root, ``cc`` found on the fixed
``SAFE_PATH`` and run with an environment of only that PATH (under ``sudo -E``, ``$CC``,
``$PATH``, ``COMPILER_PATH`` or ``GCC_EXEC_PREFIX`` are the invoking user's, and each chooses a
program the compiler runs); as anyone else ``$CC`` or ``cc`` on ``$PATH``, in their environment.
No ``CFLAGS`` are read from the environment: the flags are ``CFLAGS`` below.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
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


def build(out_dir: str | Path = ".", werror: bool = False, cc: str | None = None) -> Path:
    """Compile the plugin into ``out_dir`` (created if missing); returns the library's absolute path."""
    return build_result(out_dir, werror, cc).library


def build_result(out_dir: str | Path = ".", werror: bool = False, cc: str | None = None) -> BuildResult:
    from ..atomic import check_target, discard

    compiler = find_compiler(cc)
    out_dir = Path(out_dir).expanduser().resolve()
    target = out_dir / LIBRARY_NAME
    check_plugin_path(str(target), "choose a shorter --out")
    for f in (SOURCE, HEADER):
        if not f.is_file():
            raise CommdiagError(f"{f}: missing from the commdiag package (reinstall commdiag)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommdiagError(f"{out_dir}: cannot create: {e.strerror or e}") from None
    check_target(target)  # refuses a symlink, a device, a directory where the library goes

    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{LIBRARY_NAME}.", suffix=".tmp")
    os.close(fd)
    try:
        argv = [*compiler, *CFLAGS, *(("-Werror",) if werror else ()), "-o", tmp, str(SOURCE)]
        try:  # procs: the compiler's whole group (cc1, as, ld) ends at the deadline, not cc alone
            proc = procs.run(argv, env=compiler_env(), cwd="/", deadline_s=COMPILE_TIMEOUT_S)
        except OSError as e:
            raise CommdiagError(f"{compiler[0]}: cannot run: {e.strerror or e}") from None
        if proc.timed_out:
            raise CommdiagError(f"{compiler[0]}: no result after {COMPILE_TIMEOUT_S} s compiling {SOURCE}")
        if proc.exit_code != 0:
            detail = terminal_safe((proc.stderr or proc.stdout).decode(errors="replace").strip())[-2000:]
            raise CommdiagError(f"{compiler[0]} failed (exit {proc.exit_code}) compiling {SOURCE}:\n{detail}")
        os.chmod(tmp, 0o755)
        symbols = exported_symbols(Path(tmp))
        missing = [s for s in SYMBOLS if s not in symbols]
        if missing:
            raise CommdiagError(f"{tmp}: built, but does not export {', '.join(missing)}")
        check_target(target)
        os.replace(tmp, target)
        tmp = None
    finally:
        discard(tmp)
    return BuildResult(target, " ".join(compiler), symbols)


def exported_symbols(library: Path) -> tuple[str, ...]:
    """Which of ``SYMBOLS`` the library exports (dlopen + dlsym, as NCCL does), newest first."""
    try:
        lib = ctypes.CDLL(str(library), mode=os.RTLD_LOCAL)
    except OSError as e:
        raise CommdiagError(f"{library}: does not load: {e}") from None
    found = []
    for name in SYMBOLS:
        try:
            ctypes.c_void_p.in_dll(lib, name)
            found.append(name)
        except ValueError:
            pass
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
