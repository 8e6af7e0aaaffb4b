"""The ``commdiag`` command line: parse, call one library function, render, exit.

Only this module prints or exits.  Library errors the user can fix arrive as
``CommdiagError`` and are printed once, with their exit code (see errors.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import __version__, errors


def _fail(e: errors.CommdiagError) -> None:
    click.echo(f"commdiag: error: {e}", err=True)
    sys.exit(e.exit_code)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except errors.CommdiagError as e:
            _fail(e)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="commdiag")
def main() -> None:
    """NCCL/PCIe communication diagnostics: did the settings arrive, did NCCL apply them,
    do they help at my message sizes by more than the noise."""


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _progress_line(p) -> str:
    width = 20
    filled = int(width * p.done / p.total) if p.total else width
    bar = "#" * filled + "." * (width - filled)
    l = p.launch
    extra = f" ({l.get('error')})" if l["status"] != "ok" else ""
    return (f"[{bar}] {p.done}/{p.total}  {l['config']} trial {l['trial']}: {l['status']}{extra} "
            f"in {l.get('wall_s', 0):.1f}s  ETA {_fmt_s(p.eta_s)}")


@main.command()
@click.argument("spec_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a spec key, e.g. --set trials=5 or --set base_env.NCCL_P2P_DISABLE=1.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              help="Run folder (default: reports/<UTC timestamp>-<name>/).")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Continue an interrupted run folder; finished launches are not redone.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
def sweep(spec_file, sets, out, resume, as_json):
    """Run an all-reduce sweep over NCCL settings (one fresh torchrun launch per config and trial)."""
    from . import results, spec as spec_mod, sweep as sweep_mod

    if resume is None and spec_file is None:
        raise click.UsageError("give a SPEC_FILE, or --resume RUN_DIR")
    spec = None
    if resume is None:
        spec = spec_mod.load_spec(spec_file, sets)
        for w in spec.warnings:
            click.echo(f"commdiag: warning: {w}", err=True)
    progress = None if as_json else (lambda p: click.echo(_progress_line(p), err=True))
    res = sweep_mod.run_sweep(spec, run_dir=out, resume=resume, on_progress=progress)
    data = results.load_run(res.run_dir)
    if as_json:
        click.echo(json.dumps({"format": "commdiag-sweep-result", "version": 1, "run_dir": str(res.run_dir),
                               "state": res.state, "launches": res.counts,
                               "summary": json.loads(data.summary.to_json(orient="records"))}, indent=1))
    else:
        click.echo(render_table(data.summary))
        click.echo(f"\nrun folder: {res.run_dir}   launches: "
                   + ", ".join(f"{v} {k}" for k, v in sorted(res.counts.items())))
        if res.state == "interrupted":
            click.echo(f"interrupted: continue with  commdiag sweep --resume {res.run_dir}")
    if res.state == "interrupted":
        sys.exit(errors.EXIT_INTERRUPTED)
    sys.exit(errors.EXIT_OK if res.all_ok else errors.EXIT_LAUNCHES_FAILED)


def render_table(summary) -> str:
    """nccl-tests-style table; every time with its spread (p10-p90) and launch count."""
    if summary.empty:
        return "no samples"
    lines = []
    head = (f"{'size(B)':>12} {'tokens':>6} {'mode':>5} {'config':<28} {'time(us)':>10} {'p10-p90(us)':>19} "
            f"{'launches':>8} {'algbw':>8} {'busbw':>8} {'#wrong':>6}")
    lines.append(head)
    for r in summary.itertuples(index=False):
        tokens = "" if r.tokens is None or str(r.tokens) in ("<NA>", "nan") else str(r.tokens)
        spread = f"{r.p10_us:.2f}-{r.p90_us:.2f}"
        lines.append(f"{r.size_bytes:>12} {tokens:>6} {r.mode:>5} {str(r.config)[:28]:<28} {r.median_us:>10.2f} "
                     f"{spread:>19} {r.launches:>8} {r.algbw_gbps:>8.3f} {r.busbw_gbps:>8.3f} {r.wrong:>6}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
