"""The machine during the launches, as the verdict text and the HTML report show it.

Renders ``confounders.Confounders`` (which claims are confounded, and the run's notes)
and each launch's ``machine`` record: console lines (at most 100 columns, wrapped) and
an HTML section (every value escaped).  report.py calls in here; the analysis itself is
confounders.py.
"""

from __future__ import annotations

import html
import textwrap

from . import confounders as conf_mod
from ..errors import terminal_safe, text_lines as _lines

WIDTH = 100
CONSOLE_NOTES = 8  # run notes printed before "and N more (report.html)"


def _wrap(text: str, indent: str, first: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first if first is not None else indent,
                         subsequent_indent=indent + "  ", break_on_hyphens=False) or [indent]


def check_of(verdicts, cert):
    c = getattr(verdicts, "confounders", None)
    return c.for_claim(cert.claim) if c is not None and c.recorded else None


def claim_lines(verdicts, cert, indent: str = "    ") -> list[str]:
    """What follows a claim's line when its arms differed: "certified faster, but confounded: ..."."""
    check = check_of(verdicts, cert)
    if check is None or not check.confounded:
        return []
    head = (f"certified {cert.result}, but confounded: " if cert.certified
            else "not certified, and confounded: ")
    return confounded_lines(head, check.confounders, indent)


def confounded_lines(head: str, reasons, indent: str = "    ") -> list[str]:
    """``head`` + the first reason, "and: " + each further one, wrapped (sweep's claims, ab's verdicts)."""
    lines = []
    for i, why in enumerate(reasons):
        lines += _wrap((head if i == 0 else "and: ") + why, indent)
    return lines


def winner_confounded(verdicts, winner) -> bool:
    cert = next((c for c in verdicts.certifications if c.claim.band == winner.band and c.claim.mode == winner.mode
                 and c.claim.config == winner.config), None)
    check = check_of(verdicts, cert) if cert is not None else None
    return bool(check and check.confounded)


def winner_lines(verdicts, winner) -> list[str]:
    if winner.config is None or not winner_confounded(verdicts, winner):
        return []
    return _wrap(f"but confounded (the machine differed between its arms, above): check the machine and run "
                 f"the sweep again before installing {winner.config} (no profile was written)", "  ")


def summary_lines(verdicts) -> list[str]:
    """The run's machine state in a few lines: why it is missing, or what the launches met."""
    c = getattr(verdicts, "confounders", None)
    return state_lines(c) if c is not None else []


def state_lines(c: conf_mod.Confounders) -> list[str]:
    """``summary_lines`` of a run's confounders (sweep's and ab's runs alike)."""
    if not c.recorded:
        return _wrap(f"machine state during the launches: not recorded ({c.reason})", "")
    if not c.notes:
        return ["machine state during the launches: no throttling, other process, link below its maximum, "
                "or PCIe replay seen"]
    lines = ["machine state during the launches:"]
    for n in c.notes[:CONSOLE_NOTES]:
        lines += _wrap(n, "  ")
    if len(c.notes) > CONSOLE_NOTES:
        lines.append(f"  and {len(c.notes) - CONSOLE_NOTES} more (report.html)")
    return lines


def profile_note(verdicts, band: str | None) -> str | None:
    """The ``confounded`` line of a band winner's profile, or None when it is not confounded."""
    w = next((w for w in verdicts.band_winners if w.band == band and w.config), None)
    if w is None or not winner_confounded(verdicts, w):
        return None
    cert = next(c for c in verdicts.certifications if c.claim.band == w.band and c.claim.mode == w.mode
                and c.claim.config == w.config)
    return "; ".join(check_of(verdicts, cert).confounders)


# --------------------------------------------------------------------------- HTML


def _esc(v) -> str:
    return html.escape(terminal_safe(_lines("" if v is None else str(v))), quote=True)


def _span(v) -> str:
    if isinstance(v, list) and len(v) == 2:
        return f"{v[0]}" if v[0] == v[1] else f"{v[0]}-{v[1]}"
    return "?"


def _gpu_cell(g: dict) -> str:
    d = g.get("during") if isinstance(g.get("during"), dict) else {}
    parts = [f"GPU {g.get('index')}:"]
    if d.get("sm_clock"):
        parts.append(f"SM {_span(d['sm_clock'])} MHz, mem {_span(d.get('mem_clock'))} MHz under load "
                     f"({d.get('loaded')}/{d.get('samples')} readings)")
    else:
        parts.append(f"not under load in {d.get('samples', 0)} readings")
    if d.get("temperature_max") is not None:
        parts.append(f"{d['temperature_max']} C max")
    if d.get("power_mw_max") is not None:
        parts.append(f"{d['power_mw_max'] / 1000:.0f} W max")
    if d.get("pcie_gen_min") is not None:
        parts.append(f"link Gen{d['pcie_gen_min']} x{d.get('pcie_width_min', '?')} (lowest under load)")
    reasons = [r for r in (d.get("reasons") or {}) if r != "GPU_IDLE"]
    if reasons:
        parts.append("events " + "/".join(reasons))
    for key, what in (("pcie_replay_delta", "replays"), ("pcie_recovery_delta", "recoveries")):
        if g.get(key):
            parts.append(f"{what} +{g[key]}")
    return " ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if parts[2:] else "")


def html_section(run: dict, verdicts, stages: bool = True) -> str:
    """The report's "machine during the launches" section (``stages``: a sweep's stage column;
    ab's launches have none)."""
    c = getattr(verdicts, "confounders", None) or conf_mod.check(run)
    if not c.recorded:
        return f"<p>Not recorded: {_esc(c.reason)}.</p>"
    out = ["<p>Read by the launching process from NVML: before each launch, every "
           f"{_esc((run.get('machine_state') or {}).get('period_s'))} s while it ran, and after it. Clocks and "
           "the link are shown under load only (idle GPUs drop their clocks, idle links downtrain). A condition "
           "that hit the two arms of a claim differently marks the claim as confounded.</p>"]
    confounded = [ch for ch in c.claims if ch.confounded]
    if confounded:
        out.append("<ul class=\"warn\">" + "".join(
            f"<li><b>{_esc(ch.config)} {_esc(ch.where)} ({_esc(ch.mode)})</b>: confounded: "
            + _esc("; ".join(ch.confounders)) + "</li>" for ch in confounded) + "</ul>")
    out.append("<ul>" + ("".join(f"<li>{_esc(n)}</li>" for n in c.notes) or
                         "<li>No throttling, other process, link below its maximum, or PCIe replay seen.</li>")
               + "</ul>")
    rows = []
    for l in run.get("launches", []):
        m = l.get("machine") if isinstance(l, dict) else None
        if not isinstance(m, dict):
            continue
        if m.get("available") is not True:
            cells = _esc(m.get("error") or "not recorded")
        else:
            used = conf_mod.used_gpus(l, run)
            cells = "<br>".join(_esc(_gpu_cell(g)) for g in m.get("gpus", [])
                                if isinstance(g, dict) and (used is None or g.get("index") in used))
        facts = "<br>".join(_esc(f) for f in c.launches.get(l.get("index"), [])) or ""
        stage = f"<td>{_esc(l.get('stage', 1))}</td>" if stages else ""
        rows.append(f"<tr><td>{_esc(l.get('index'))}</td><td>{_esc(l.get('config'))}</td>"
                    f"{stage}<td>{cells}</td><td class=\"bad\">{facts}</td></tr>")
    out.append("<details><summary>every launch</summary><table><tr><th>launch</th><th>config</th>"
               + ("<th>stage</th>" if stages else "")
               + "<th>its GPUs</th><th>conditions</th></tr>" + "".join(rows) + "</table></details>")
    return "\n".join(out)
