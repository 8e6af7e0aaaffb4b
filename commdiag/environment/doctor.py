"""``commdiag doctor``: detect plus check-env, as one ranked health report.

One record per thing checked (healthy ones included), each with its evidence
and what to do; records are ranked by severity (critical, warning, info, ok).
The report is unhealthy -- exit 1 in the CLI -- when any record is critical or
a warning.  Pure rules over a ``Detection`` and an ``EnvCheck`` (``findings``)
plus one function that gathers both (``doctor``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from . import detect as detect_mod, envcheck, ncclib, p2plevel
from .topology import MIXED, NVLINK, PCIE_NO_P2P, PCIE_P2P
from . import pcieadvice

SEVERITY = {"critical": 3, "warning": 2, "info": 1, "ok": 0}


@dataclass(frozen=True)
class Finding:
    severity: str  # critical, warning, info, ok
    check: str  # what was checked, e.g. "env NCCL_PROTO", "hooks /srv/venv/bin/python"
    title: str
    evidence: str = ""
    action: str = ""


@dataclass(frozen=True)
class DoctorReport:
    findings: list[Finding]
    detection: detect_mod.Detection
    env: envcheck.EnvCheck
    libs: list[ncclib.NcclLibs] = ()  # per interpreter: torch's NCCL and PyNccl's (ncclib.py)

    @property
    def healthy(self) -> bool:
        return not any(SEVERITY[f.severity] >= SEVERITY["warning"] for f in self.findings)

    def to_json(self) -> dict:
        return {"healthy": self.healthy, "findings": [asdict(f) for f in self.findings],
                "detection": self.detection.to_json(), "env": self.env.to_json(),
                "nccl_libraries": [l.to_json() for l in self.libs]}


def _enables(value: str, item: str) -> bool:
    """Does an NCCL_PROTO/NCCL_ALGO value explicitly ask for ``item`` (not the ^exclusion form)?"""
    for part in value.split(";"):
        body = part.split(":", 1)[1] if ":" in part else part
        if not body.startswith("^") and item.lower() in (x.strip().lower() for x in body.split(",")):
            return True
    return False


def _settings_in_play(env: envcheck.EnvCheck) -> dict[str, tuple[str, str]]:
    """NAME -> (value, where): what NCCL would see here (getenv, then nccl.conf), plus the expectation."""
    out: dict[str, tuple[str, str]] = {}
    for v in env.vars:
        if v.getenv is not None:
            out[v.name] = (v.getenv, "this environment")
        elif v.expected is not None:
            out[v.name] = (v.expected, f"expected ({env.source})")
    for name, (value, path) in envcheck.conf_effective(env.conf_files).items():
        out.setdefault(name, (value, path))
    return out


def library_findings(libs: list[ncclib.NcclLibs]) -> list[Finding]:
    """Per interpreter: which NCCL torch and PyNccl load there, and a version mismatch between them."""
    out = []
    for r in libs:
        check = f"NCCL libraries {r.python}"
        if r.error:
            out.append(Finding("info", check, "could not see which libnccl this interpreter loads", r.error))
            continue
        mism = r.mismatches()
        versions = [f"torch {r.torch_lib.version if r.torch_lib else r.torch_nccl or 'none'}"]
        versions += [f"{who} {lib.version or 'not loaded'}" for who, lib in r.pynccl()]
        if not mism:
            out.append(Finding("ok", check, "; ".join(versions)))
        for m in mism:
            severity = "warning" if "two NCCLs" in m else "info"
            out.append(Finding(severity, check, "two NCCL libraries in one server process: " + "; ".join(versions),
                               m, "point SGLANG_NCCL_SO_PATH / VLLM_NCCL_SO_PATH at torch's libnccl (or unset "
                               "them) unless the other NCCL is wanted; then check the server's own log with "
                               "`commdiag explain --log FILE` (NCCL prints its version per process)"))
    return out


def findings(det: detect_mod.Detection, env: envcheck.EnvCheck,
             libs: list[ncclib.NcclLibs] = ()) -> list[Finding]:
    out: list[Finding] = []
    # 1. did the expected settings arrive in this process
    for v in env.vars:
        if v.status in envcheck.FAILING:
            out.append(Finding("critical", f"env {v.name}", f"{v.name} {v.status}", v.detail,
                               "export it where the workers start (service unit, launcher), or install it with "
                               "`commdiag install-hook`; then check inside a worker with `commdiag.check_env()`"))
        elif v.status == envcheck.FROM_CONF:
            out.append(Finding("ok", f"env {v.name}", f"{v.name} comes from an NCCL config file", v.detail))
        elif v.status == envcheck.OK:
            out.append(Finding("ok", f"env {v.name}", f"{v.name}={v.getenv} as expected"))
    if not any(v.expected is not None for v in env.vars):
        out.append(Finding("info", "env", "no expectation given: nothing to compare",
                           " ".join(f"{v.name}={v.getenv}" for v in env.vars) or "no NCCL_* variables set",
                           "pass --expect NAME=VALUE or --profile RUN_DIR/profile.env"))
    # 2. Python hooks
    for r in det.pythons:
        check = f"hooks {r.python}"
        if r.hooks is None:
            out.append(Finding("warning", check, "could not probe this interpreter", r.error or ""))
            continue
        h = r.hooks
        bad = False
        for s in h.shadowed_sitecustomize:
            bad = True
            loaded = h.sitecustomize or "nothing"
            why, command, how = detect_mod.shadowing(h, s)
            out.append(Finding("warning", check, f"sitecustomize.py at {s} is shadowed by {loaded}", why,
                               f"use `{command}` ({how})"))
        if h.hooks_disabled or "-I" in h.disabled_by:
            bad = True
            out.append(Finding("warning", check, f"startup hooks disabled by {', '.join(h.disabled_by)}",
                               f"{h.executable} started this way loads no sitecustomize",
                               "set the variables in the service environment instead (install-hook --systemd)"))
        if h.cross_check not in ("agrees", "skipped"):
            bad = True
            out.append(Finding("warning", check, "a normal start loads something else than the probe predicts",
                               h.cross_check, "inspect the sitecustomize that loads (it may raise on import)"))
        if not bad:
            out.append(Finding("ok", check, f"sitecustomize: {h.sitecustomize or 'none'}; nothing shadowed"))
    # 3. topology
    t = det.topology
    if not t.available:
        out.append(Finding("info", "topology", "no GPU topology", t.reason or "",
                           "topology checks (LL128, NVLS, P2P) are skipped"))
    else:
        out.append(Finding("ok", "topology", f"{len(t.gpus)} GPU(s): {t.classification}", t.matrix().splitlines()[0]
                           if t.gpus else "", " ".join(t.advice)))
        play = _settings_in_play(env)
        proto = play.get("NCCL_PROTO")
        if proto and _enables(proto[0], "LL128") and t.classification in (PCIE_P2P, PCIE_NO_P2P, MIXED):
            out.append(Finding("critical", "NCCL_PROTO vs topology",
                               f"NCCL_PROTO={proto[0]} on a PCIe topology: NCCL documents possible data corruption",
                               f"NCCL_PROTO={proto[0]} from {proto[1]}; topology {t.classification}; NCCL enables "
                               "LL128 by default only where the platform supports it",
                               "remove LL128 from NCCL_PROTO (leave NCCL_PROTO unset, or use LL,Simple)"))
        algo = play.get("NCCL_ALGO")
        if algo and (_enables(algo[0], "NVLS") or _enables(algo[0], "NVLSTree")) and not t.has_nvlink:
            out.append(Finding("warning", "NCCL_ALGO vs topology",
                               f"NCCL_ALGO={algo[0]} on a machine without NVLink",
                               f"NCCL_ALGO={algo[0]} from {algo[1]}; NVLS needs NVLink SHARP (NVSwitch)",
                               "drop NVLS/NVLSTree from NCCL_ALGO"))
        p2pd = play.get("NCCL_P2P_DISABLE")
        if p2pd and p2pd[0] == "1" and t.classification == NVLINK:
            out.append(Finding("warning", "NCCL_P2P_DISABLE vs topology", "NCCL_P2P_DISABLE=1 on an NVLink machine",
                               f"from {p2pd[1]}", "unset NCCL_P2P_DISABLE: it moves traffic off NVLink"))
        # PCIe pairs under different host bridges: NCCL's default (>= 2.23.4) keeps them off P2P
        versions = [det.versions.get("nccl")] + [l.version for r in libs for l in r.libs if l.ok]
        out += [Finding(*a) for a in p2plevel.advice(t, versions, play)]
        lvl = play.get("NCCL_P2P_LEVEL")
        if lvl and t.classification == PCIE_NO_P2P:
            out.append(Finding("info", "NCCL_P2P_LEVEL vs topology", f"NCCL_P2P_LEVEL={lvl[0]} has no effect here",
                               "no GPU pair supports P2P", "leave it unset"))
    # ACS and IOMMU between the GPUs (pcie.py, pcieadvice.py)
    if det.pcie is not None:
        out += [Finding(**r) for r in pcieadvice.records(det.pcie)]

    # 4. config files: the environment wins over them, which surprises people
    for name, (value, path) in envcheck.conf_effective(env.conf_files).items():
        got = os.environ.get(name)
        if got is not None and got != value:
            out.append(Finding("info", f"nccl.conf {name}", f"{path} sets {name}={value}, the environment wins",
                               f"this process has {name}={got}"))
    out += library_findings(list(libs))
    v = det.versions
    out.append(Finding("info", "versions", ", ".join(f"{k} {v[k]}" for k in ("driver", "cuda_driver", "nccl", "torch",
                                                                            "python") if v.get(k))))
    return sorted(out, key=lambda f: -SEVERITY[f.severity])


def doctor(pythons=(), *, expect: dict | None = None, profile=None, nvml_readings: dict | None = None,
           with_torch: bool = True, conf_root: str | None = None, sysfs_root: str | None = "/",
           with_libs: bool = True) -> DoctorReport:
    det = detect_mod.detect(pythons, nvml_readings=nvml_readings, with_torch=with_torch, sysfs_root=sysfs_root)
    env = envcheck.check_env(expect, profile=profile, conf_root=conf_root)
    # the interpreters detect probed; one whose hooks could not be probed is not started again
    # each as whom the hook probe's trust check started it (as root: the owner of a tree not root's alone)
    libs = [ncclib.probe(r.python, run_as=_run_as(r.hooks)) for r in det.pythons if r.hooks is not None] \
        if with_libs else []
    return DoctorReport(findings(det, env, libs), det, env, libs)


def _run_as(hooks) -> "trust.RunAs | None":
    from . import trust

    return None if not hooks.run_as else trust.RunAs(hooks.run_as[0], hooks.run_as[1], "its hook probe's owner")


def render(r: DoctorReport) -> str:
    lines = []
    for f in r.findings:
        # wrapped to 100 columns (the headline too: a long interpreter path); a path longer than a line stays whole
        lines += detect_mod.wrapped(f"[{f.severity.upper():8}] ", f"{f.check}: {f.title}", "")
        if f.evidence and f.severity != "ok":
            lines += detect_mod.wrapped("evidence: ", f.evidence, " " * 11)
        if f.action and f.severity != "ok":
            lines += detect_mod.wrapped("do: ", f.action, " " * 11)
    bad = sum(1 for f in r.findings if SEVERITY[f.severity] >= 2)
    lines.append(f"\n{'healthy' if r.healthy else f'UNHEALTHY: {bad} finding(s) need attention'} "
                 f"({len(r.findings)} checks)")
    return "\n".join(lines)
