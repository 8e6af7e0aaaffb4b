"""Which libnccl a Python interpreter's processes load: torch's, and the one SGLang's and vLLM's PyNccl load.

PyNccl (the path SGLang's and vLLM's decode CUDA graphs take on PCIe boxes) loads NCCL with ctypes:
``SGLANG_NCCL_SO_PATH`` / ``VLLM_NCCL_SO_PATH`` when set, else ``ctypes.CDLL("libnccl.so.2")`` after
``import torch``.  A bare name resolves to a library already loaded under that soname (torch's, when
torch links libnccl.so.2 dynamically), else through LD_LIBRARY_PATH and the loader cache; a path
loads that file, so one process can hold two NCCLs.

``probe(python)`` starts the interpreter isolated (``-I``: no current folder, no PYTHON* variables,
no user site) through pyprobe's runner (bounded time and output, its process group killed after),
imports torch there as a server does (a CPU build, which has no NCCL, is known from its
torch/version.py without the import), and reports per library the version (``ncclGetVersion``) and
the file it was loaded from (the mapping that holds ``ncclGetVersion``, from /proc/self/maps).  As
root, nothing another user can change is run or loaded: the probe does not start when the interpreter,
an LD_PRELOAD entry or an LD_LIBRARY_PATH folder is not root's alone, and a ``*_NCCL_SO_PATH`` file
that is not is skipped, with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from dataclasses import asdict, dataclass, field

from . import pyprobe
from ..errors import CommdiagError

SO_PATH_VARS = (("SGLang", "SGLANG_NCCL_SO_PATH"), ("vLLM", "VLLM_NCCL_SO_PATH"))
BARE = "libnccl.so.2"
TORCH_TIMEOUT_NOTE = "importing torch can take 10-30 s on a busy machine"

# Tuner plugin ABIs each NCCL looks for (src/plugin/tuner*.cc at each tag: ncclTunerPlugin_vN symbols).
TUNER_ABIS = [((2, 19, 0), (1,)), ((2, 21, 0), (2,)), ((2, 22, 0), (2, 3)), ((2, 24, 0), (2, 3, 4)),
              ((2, 28, 0), (2, 3, 4, 5)), ((2, 30, 0), (2, 3, 4, 5, 6))]
COMMDIAG_TUNER_ABIS = (2, 3, 4, 5, 6)  # commdiag/tuner/commdiag_tuner.c exports these

# Runs in the target interpreter (-I): stdlib only before torch; replies on one marked line.
_SCRIPT = r'''
import ctypes, json, os, re, sys
out = {"error": None, "executable": sys.executable, "python": "%d.%d.%d" % sys.version_info[:3], "libs": []}
plan = json.loads(sys.argv[1])
def maps():
    try:
        with open("/proc/self/maps") as f:
            rows = f.read().splitlines()
    except OSError:
        return []
    found = []
    for row in rows:
        parts = row.split(None, 5)
        if len(parts) == 6 and "-" in parts[0]:
            lo, hi = parts[0].split("-")
            found.append((int(lo, 16), int(hi, 16), parts[5]))
    return found
def loaded(label, name):
    entry = {"label": label, "requested": name, "path": None, "code": None, "error": None}
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        entry["error"] = str(e)[:300]
        return entry
    try:
        fn = lib.ncclGetVersion
    except AttributeError:
        entry["error"] = "no ncclGetVersion symbol: not an NCCL library"
        return entry
    v = ctypes.c_int(0)
    rc = fn(ctypes.byref(v))
    entry["code"] = v.value if rc == 0 else None
    if rc != 0:
        entry["error"] = "ncclGetVersion returned %d" % rc
    addr = ctypes.cast(fn, ctypes.c_void_p).value or 0
    for lo, hi, path in maps():
        if lo <= addr < hi:
            entry["path"] = path
    return entry
def cpu_torch():
    # torch's version when its torch/version.py says it is a CPU build: no NCCL to map, so no import
    # (seconds); anything unexpected: None, and torch is imported as a server does
    import ast, importlib.util
    try:
        spec = importlib.util.find_spec("torch")
        folder = list(spec.submodule_search_locations)[0]
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read(100000))
        found = {}
        for node in tree.body:
            t = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                else getattr(node, "target", None)
            if isinstance(t, ast.Name) and t.id in ("__version__", "cuda", "hip") and node.value is not None:
                found[t.id] = ast.literal_eval(node.value)
        version = found.get("__version__")
        if isinstance(version, str) and "cuda" in found and found["cuda"] is None and found.get("hip") is None:
            return version
    except Exception:
        pass
    return None
def torch_info():
    cpu = cpu_torch()
    if cpu is not None:
        out["torch"], out["torch_cuda"] = cpu, None
        return
    try:
        import torch
        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        if torch.version.cuda:
            try:
                tv = torch.cuda.nccl.version()
                out["torch_nccl"] = ".".join(map(str, tv)) if isinstance(tv, tuple) else str(tv)
            except Exception as e:
                out["torch_nccl_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
    except Exception as e:
        out["torch"] = None
        out["torch_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
try:
    torch_info()
    nccl = re.compile(r"/libnccl\.so(\.[0-9]+)*$")
    for path in sorted({p for _, _, p in maps() if nccl.search(p)}):
        out["libs"].append(loaded("torch", path))  # mapped by torch's import: no new code runs
    for label, name in plan["load"]:
        out["libs"].append(loaded(label, name))
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
sys.stdout.write("\n''' + pyprobe._MARK + r'''" + json.dumps(out) + "\n")
'''


def version_text(code: int | None) -> str | None:
    """NCCL_VERSION_CODE -> "2.28.9" (X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before)."""
    if code is None or code <= 0:
        return None
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _vt(text: str | None) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def tuner_abis(version: str | None) -> tuple[int, ...]:
    """The tuner plugin ABI versions an NCCL looks for (empty before 2.19 or when unknown)."""
    v = _vt(version)
    found: tuple[int, ...] = ()
    for since, abis in TUNER_ABIS:
        if v is not None and v >= since:
            found = abis
    return found


@dataclass(frozen=True)
class Lib:
    """One library as the interpreter loaded it."""

    label: str  # "torch", "libnccl.so.2", "SGLANG_NCCL_SO_PATH", "VLLM_NCCL_SO_PATH"
    requested: str | None  # the name or path asked for
    path: str | None  # the file it was loaded from
    version: str | None
    error: str | None = None  # why it did not load, or was not tried

    @property
    def ok(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class NcclLibs:
    """torch's NCCL and PyNccl's in one interpreter's environment, and what differs."""

    python: str
    torch: str | None = None  # torch version; None: not importable
    torch_cuda: str | None = None
    torch_nccl: str | None = None  # torch.cuda.nccl.version(): what torch says
    libs: list[Lib] = field(default_factory=list)
    error: str | None = None  # the probe itself failed (or was refused)
    notes: list[str] = field(default_factory=list)

    @property
    def torch_lib(self) -> Lib | None:
        return next((l for l in self.libs if l.label == "torch" and l.ok), None)

    def pynccl(self) -> list[tuple[str, Lib]]:
        """(who loads it, library) for SGLang's and vLLM's PyNccl in this environment."""
        out = []
        bare = next((l for l in self.libs if l.label == BARE), None)
        users = []
        for who, var in SO_PATH_VARS:
            lib = next((l for l in self.libs if l.label == var), None)
            if lib is not None:
                out.append((f"{who}'s PyNccl ({var})", lib))
            else:
                users.append(who)
        if bare is not None:
            out.append(((" and ".join(f"{u}'s" for u in users) + " PyNccl (libnccl.so.2)") if users
                        else "libnccl.so.2 (a plain dlopen)", bare))
        return out

    def mismatches(self) -> list[str]:
        """One line per library whose NCCL version differs from torch's (or, without torch's, from
        libnccl.so.2's), saying what it means for NCCL_* variables and the tuner plugin."""
        ref_name, ref = ("torch", self.torch_lib)
        if ref is None and self.torch_nccl is not None:
            ref = Lib("torch", None, "linked into torch (no libnccl mapped)", self.torch_nccl)
        if ref is None:
            ref_name, ref = BARE, next((l for l in self.libs if l.label == BARE and l.ok), None)
        if ref is None:
            return []
        out = []
        for who, lib in self.pynccl():
            if not lib.ok or lib is ref:
                continue
            if lib.version != ref.version:
                out.append(explain_mismatch(ref_name, ref, who, lib))
            elif lib.path and ref.path and os.path.realpath(lib.path) != os.path.realpath(ref.path):
                out.append(f"{who} loads a second copy of NCCL {lib.version} ({lib.path}) beside {ref_name}'s "
                           f"({ref.path}): same version, separate NCCL state in one process")
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "mismatches": self.mismatches(),
                "pynccl": [{"who": who, "label": lib.label} for who, lib in self.pynccl()]}


def _abis(a: tuple[int, ...]) -> str:
    return f"v{a[0]}-v{a[-1]}" if len(a) > 1 else (f"v{a[0]}" if a else "none")


def explain_mismatch(ref_name: str, ref: Lib, who: str, lib: Lib) -> str:
    """What two NCCL versions in one process mean for NCCL_* variables and for a tuner plugin."""
    ra, la = tuner_abis(ref.version), tuner_abis(lib.version)
    tuner = (f"a tuner plugin (NCCL_TUNER_PLUGIN) is loaded by each NCCL on its own, and each takes only the "
             f"ABIs it knows ({ref.version}: {_abis(ra)}, {lib.version}: {_abis(la)})")
    if set(ra) != set(la):
        tuner += ", so a plugin built for one may not load in the other"
    ours = set(COMMDIAG_TUNER_ABIS) & set(la)
    tuner += (f"; commdiag's plugin exports v2-v6, so {lib.version} takes v{max(ours)}" if ours
              else f"; commdiag's plugin (v2-v6) does not load in {lib.version}")
    return (f"{ref_name} uses NCCL {ref.version} ({ref.path}) but {who} loads NCCL {lib.version} ({lib.path}): "
            "two NCCLs in one server process. Both read the same NCCL_* variables (and nccl.conf), so one "
            "setting reaches both, but each applies it with its own version's meaning and defaults (e.g. "
            f"the P2P level default changed in 2.23.4); {tuner}. To run one NCCL, point the variable at "
            f"{ref_name}'s library or unset it.")


# --------------------------------------------------------------------------- running the probe


def _unsafe_for_root(path: str) -> str | None:
    """Why root must not run or load ``path`` (None: every component is root's and no one else can
    replace it): each component owned by uid 0, none writable by group or others except sticky folders."""
    if not path or not os.path.isabs(path):
        return f"{path!r} is relative to the current folder"
    real = os.path.realpath(path)
    for target in dict.fromkeys([os.path.normpath(path), real]):
        parts = target.split(os.sep)
        for i in range(1, len(parts) + 1):
            comp = os.sep.join(parts[:i]) or os.sep
            try:
                st = os.lstat(comp)
            except OSError as e:
                return f"{comp}: {e.strerror}"
            if st.st_uid != 0:
                return f"{comp} is owned by uid {st.st_uid}, not root"
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
                return f"{comp} is writable by group or others"
    return None


def _unsafe_search_dir(d: str) -> str | None:
    """An LD_LIBRARY_PATH entry as root: it must exist and be root's (a missing one could be created by
    anyone who can write its parent, sticky or not; an empty entry is the current folder)."""
    if not d or not os.path.isabs(d):
        return f"LD_LIBRARY_PATH entry {d!r} is relative to the current folder"
    if not os.path.isdir(d):
        return f"LD_LIBRARY_PATH entry {d!r} is not an existing folder"
    return _unsafe_for_root(d)


def root_refusal(exe: str, env: dict[str, str]) -> str | None:
    """As root, why the probe must not start at all: the interpreter, an LD_PRELOAD entry or an
    LD_LIBRARY_PATH folder (both change what the interpreter itself loads) is not root's alone."""
    if os.sep not in exe:
        exe = shutil.which(exe, path=env.get("PATH")) or exe
    why = _unsafe_for_root(exe)
    for entry in (env.get("LD_PRELOAD") or "").replace(":", " ").split():
        why = why or (_unsafe_for_root(entry) if os.sep in entry else f"LD_PRELOAD entry {entry!r} is searched for")
    if env.get("LD_LIBRARY_PATH"):  # glibc ignores an empty value; an empty entry in a list is "."
        for d in env["LD_LIBRARY_PATH"].split(":"):
            why = why or _unsafe_search_dir(d)
    return why


def plan(env: dict[str, str], euid: int | None = None) -> tuple[list[list[str]], dict[str, str]]:
    """What the child loads after torch: [[label, name]], and what it must not (label -> why).  As root a
    ``*_NCCL_SO_PATH`` file another user can change is not loaded (a bare name is searched for only in
    folders ``root_refusal`` checked, and the loader's own)."""
    euid = os.geteuid() if euid is None else euid
    load, skipped = [[BARE, BARE]], {}
    for _, var in SO_PATH_VARS:
        value = env.get(var)
        if not value:
            continue
        if euid == 0 and os.sep in value and (why := _unsafe_for_root(value)):
            skipped[var] = f"as root, {var}={value} is not loaded: {why}"
        else:
            load.append([var, value])
    return load, skipped


def probe(python: str | None = None, env: dict[str, str] | None = None, *, euid: int | None = None,
          run_as=None) -> NcclLibs:
    """Start ``python`` (default: this one) isolated and report its NCCL libraries; never raises for a
    target that cannot be probed (``error`` says why).  ``run_as`` (trust.RunAs, the choice the hook
    probe's trust check made for this interpreter): started as that user, as every other start of
    it is (``-I`` still runs its .pth files)."""
    import json

    exe = python or sys.executable
    env = dict(os.environ if env is None else env)
    euid = (os.geteuid() if euid is None else euid) if run_as is None else run_as.uid
    if euid == 0 and (why := root_refusal(exe, env)):
        return NcclLibs(exe, error=f"not run as root: {why}; run this check as the user that owns it")
    load, skipped = plan(env, euid)
    try:
        raw = pyprobe._run([exe, "-I", "-c", _SCRIPT, json.dumps({"load": load})], env, run_as=run_as)
    except CommdiagError as e:
        return NcclLibs(exe, error=f"{e} ({TORCH_TIMEOUT_NOTE})" if "did not answer" in str(e) else str(e))
    return _from_reply(exe, raw, skipped)


def _s(v, n: int = 300) -> str | None:
    return None if v is None else str(v)[:n]


def _from_reply(exe: str, raw: dict, skipped: dict[str, str]) -> NcclLibs:
    libs = []
    for e in raw.get("libs") or []:
        if not isinstance(e, dict):
            continue
        code = e.get("code") if isinstance(e.get("code"), int) and not isinstance(e.get("code"), bool) else None
        libs.append(Lib(_s(e.get("label"), 40) or "?", _s(e.get("requested")), _s(e.get("path")), version_text(code),
                        _s(e.get("error"))))
    libs += [Lib(label, None, None, None, why) for label, why in skipped.items()]
    notes = []
    if raw.get("torch") is None:
        notes.append(f"torch is not importable here ({_s(raw.get('torch_error'), 120)}): no torch NCCL")
    elif not raw.get("torch_cuda"):
        notes.append(f"torch {_s(raw.get('torch'), 40)} is a CPU build: it has no NCCL")
    return NcclLibs(_s(raw.get("executable")) or exe, _s(raw.get("torch"), 60), _s(raw.get("torch_cuda"), 20),
                    _s(raw.get("torch_nccl"), 20), libs, _s(raw.get("error")), notes)


def render(r: NcclLibs, indent: str = "  ") -> list[str]:
    """Lines for check-env and doctor: torch's NCCL, PyNccl's, and any mismatch (wrapped to 100 columns)."""
    import textwrap

    def wrap(text: str, first: str, rest: str) -> list[str]:
        return textwrap.wrap(text, 100, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)

    lines = wrap(f"NCCL libraries of {r.python} (python -I, after import torch, as SGLang and vLLM load them):",
                 indent, indent + "  ")
    if r.error:
        return lines + wrap(f"not probed: {r.error}", indent + "  ", indent + "    ")
    t = r.torch_lib
    if t is not None:
        lines += wrap(f"torch {r.torch}: NCCL {t.version} from {t.path}", indent + "  ", indent + "    ")
    elif r.torch_nccl:
        lines += wrap(f"torch {r.torch}: NCCL {r.torch_nccl}, linked into torch (no libnccl mapped)",
                      indent + "  ", indent + "    ")
    for n in r.notes:
        lines += wrap(n, indent + "  ", indent + "    ")
    for who, lib in r.pynccl():
        what = (f"NCCL {lib.version} from {lib.path}" if lib.ok else f"not loaded: {lib.error}")
        req = f" = {lib.requested}" if lib.requested and lib.label != BARE else ""
        lines += wrap(f"{who}{req}: {what}", indent + "  ", indent + "    ")
    for m in r.mismatches():
        lines += wrap(m, indent + "  MISMATCH: ", indent + "    ")
    return lines

