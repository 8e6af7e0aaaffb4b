"""What install-hook (and ``ab --config``) may put into every process's environment: the one rule.

A profile is data from a sweep's run folder, usually made by a user, installed by root.  Its names and
values become part of every start of the target: a Python hook, a systemd unit's environment, nccl.conf.
So not every ``NAME=VALUE`` can be installed:

* **Names.** Settings of NCCL (``NCCL_*``) and the few others commdiag documents (``EXTRA``: the
  multicast switches every shipped spec sets, torch's NCCL watchdog switches).  Loader and interpreter
  variables (``LD_*``, ``PYTHON*``, ``DYLD_*``, ``GCONV_PATH``, ``MALLOC_*``, ...) never: each one
  chooses code that every process then runs.  Any other name is refused as "not an NCCL setting".
* **Values that name a file NCCL loads or reads** (``*_PLUGIN``, ``*_FILE`` but the dumps,
  ``NCCL_TUNER_CONFIG_FILE``, ``NCCL_TOPO_FILE``, ``NCCL_CONF_FILE``, ``NCCL_GRAPH_FILE``): as root,
  an absolute path to an existing regular file that no user other than root can change (it and every
  folder above it: ``ownership``).  A plugin may also be a bare name (``NCCL_NET_PLUGIN=none``, or
  ``aws-ofi`` for ``libnccl-net-aws-ofi.so``), which NCCL asks the loader for: the system's library
  folders.  A legitimate ``NCCL_TUNER_PLUGIN=~user/build/...so`` is refused as root: every NCCL
  process would load a library that user can replace (``install-hook --tuner`` installs the plugin
  root-owned instead).
* **Values that name a file NCCL writes** (``NCCL_DEBUG_FILE``, ``*_DUMP_FILE``): refused for a
  system-wide target (as root, or ``--systemd``, or ``--nccl-conf system``): every NCCL process,
  root's included, would create or overwrite that path.

``check`` applies the rule; ``named_files`` lists the settings that name files, which ``--dry-run``
and the install's output show first.  Values were already checked (``ncclvars.check_setting``).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat

from .. import ownership
from ..errors import CommdiagError, brief

# Documented beside NCCL's own (README "NVLink multicast stays off"; docs/install-hook.md): integers only.
EXTRA = ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
         "TORCH_NCCL_BLOCKING_WAIT", "CUDA_DEVICE_MAX_CONNECTIONS")
# Variables that choose code a process runs (the loader's, an interpreter's, glibc's): never installed.
_CODE = re.compile(r"^(LD_|DYLD_|PYTHON|PERL|RUBY|NODE_|JAVA_|_JAVA_|GCONV_PATH$|MALLOC_|GLIBC_|LOCPATH$|"
                   r"NLSPATH$|HOSTALIASES$|RES_OPTIONS$|TMPDIR$|PATH$|HOME$|BASH_ENV$|ENV$|SHELLOPTS$|IFS$)")
_WRITES = re.compile(r"^NCCL_(DEBUG_FILE|.*DUMP.*)$")
_READS = re.compile(r"^NCCL_(.*_PLUGIN|.*_FILE|.*_PATH)$")
_BARE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_INT = re.compile(r"^-?\d{1,10}$")


def kind(name: str) -> str:
    """"reads" (the value names a file NCCL loads or reads), "writes" (one it writes) or "plain"."""
    if _WRITES.match(name):
        return "writes"
    if _READS.match(name):
        return "reads"
    return "plain"


def named_files(values: dict[str, str]) -> list[str]:
    """``NAME=VALUE (what NCCL does with it)`` for each setting whose value names a file."""
    out = []
    for name, value in values.items():
        k = kind(name) if name.startswith("NCCL_") else "plain"
        if k == "reads":
            out.append(f"{name}={value} (every NCCL process loads or reads this file)")
        elif k == "writes":
            out.append(f"{name}={value} (every NCCL process writes this file)")
    return out


def _name_error(name: str, value: str) -> str | None:
    if _CODE.match(name):
        return (f"{name} chooses code that every process of the target runs (a loader or interpreter "
                "variable); install-hook never installs it")
    if name in EXTRA:
        return None if _INT.match(value) else f"{name}: {brief(value)} is not an integer"
    if not name.startswith("NCCL_"):
        return (f"{name} is not an NCCL setting; install-hook installs NCCL_* variables and "
                f"{', '.join(EXTRA)} (docs/install-hook.md)")
    return None


def _file_error(name: str, value: str, root: str | None) -> str | None:
    if value == "" or ("/" not in value and _BARE.match(value) and name.endswith("_PLUGIN")):
        return None  # empty (NCCL's default), or a plugin by name: the loader looks in the system's folders
    if not value.startswith("/") or posixpath.normpath(value) != value:
        return f"{name}={brief(value)}: must be an absolute, normalized path to a file root owns"
    path = posixpath.join(root, value.lstrip("/")) if root else value
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{name}={brief(value)}: {e.strerror}; it must name an existing file root owns"
    if not stat.S_ISREG(st.st_mode):
        return f"{name}={brief(value)}: not a regular file"
    found = ownership.first_finding(path)
    if found is not None:
        return (f"{name}={brief(value)}: {found.path} is {found.why}; every NCCL process would load or read a "
                "file that user can replace. Install a copy root owns (install-hook --tuner does so for the "
                "tuner plugin)")
    return None


def check(values: dict[str, str], *, system_wide: bool, root: str | None = None, own: dict[str, str] | None = None,
          origin: str = "install-hook") -> None:
    """Refuse (CommdiagError) the first setting the rule does not allow.  ``own``: settings commdiag
    itself installs (``--tuner``'s plugin and rules), exempt from the file checks (they do not exist
    until the install writes them, root-owned).  ``root``: a staged --root, where file values are looked up."""
    as_root = os.geteuid() == 0
    for name, value in values.items():
        error = _name_error(name, value)
        if error is None and name.startswith("NCCL_") and not (own and own.get(name) == value):
            k = kind(name)
            if k == "writes" and (system_wide or as_root) and value:
                error = (f"{name}={brief(value)}: every NCCL process of a system-wide target (root's included) "
                         "would create or overwrite that file; set it per run instead, not with install-hook")
            elif k == "reads" and as_root:
                error = _file_error(name, value, root)
        if error:
            raise CommdiagError(f"{origin}: {error}")
