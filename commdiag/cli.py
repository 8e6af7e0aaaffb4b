"""The ``commdiag`` command line: parse, call one library function, render, exit.

Only this module prints or exits.  Library errors the user can fix arrive as
``CommdiagError`` and are printed once, with their exit code (see errors.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import __version__, errors, linewrap


def _echo(message="", err: bool = False, nl: bool = True, wrap: bool = True) -> None:
    """Every line commdiag prints: control characters (OSC titles, clear screen, cursor moves) from
    config names, environment values, paths or a hostile interpreter's output are shown, never obeyed;
    and every line fits 100 columns (linewrap.py).  ``wrap=False`` only for JSON and verbatim file
    content, where a line break would change what is shown."""
    text = errors.terminal_safe(message)
    if wrap and str(text).lstrip().startswith(("{", "[")):
        try:  # a JSON document (every --json): a line break inside a string would break it
            json.loads(text)
            wrap = False
        except ValueError:
            pass  # text that merely starts with a bracket, e.g. doctor's "[INFO    ]" records
    click.echo(linewrap.fit(text) if wrap else text, err=err, nl=nl)


def _echo_verbatim(text: str, verbatim: str) -> None:
    """``text`` wrapped, except the ``verbatim`` part it holds (a diff of file content), printed as is."""
    before, found, after = text.partition(verbatim) if verbatim else (text, "", "")
    if not found:
        _echo(text)
        return
    _echo(before, nl=False)
    _echo(found, nl=False, wrap=False)
    _echo(after)


def _fail(e: errors.CommdiagError) -> None:
    _echo(f"commdiag: error: {errors.terminal_safe(e)}", err=True)
    sys.exit(e.exit_code)


def _unexpected(e: BaseException, command: str | None) -> str:
    """One line for an exception nobody turned into a CommdiagError: what failed, on which file."""
    if isinstance(e, OSError) and e.strerror:
        what = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
        if e.filename2:
            what += f" ({e.filename2})"
    else:
        what = f"{type(e).__name__}: {e}"
    what = " ".join(errors.terminal_safe(what).split())
    if len(what) > 400:
        what = what[:400] + " [...]"
    return (f"commdiag: error: {command or 'commdiag'} failed: {what} "
            "(run with --debug for the traceback)")


class _Group(click.Group):
    """Catches once what the commands raise: a CommdiagError is its message and exit code;
    any other exception is one line naming what failed (exit 2), its traceback behind --debug.
    Lists the commands in the order of the workflow (README "On your GPU box"), not alphabetically."""

    ORDER = ("doctor", "p2p", "sweep", "confirm", "step", "trace", "ab", "report", "compare", "explain", "install-hook",
             "tuner", "check-env", "detect", "nodes")

    def list_commands(self, ctx):
        names = super().list_commands(ctx)
        return [n for n in self.ORDER if n in names] + sorted(n for n in names if n not in self.ORDER)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except errors.CommdiagError as e:
            _fail(e)
        except click.exceptions.ClickException as e:
            e.message = linewrap.fit("Error: " + e.message)[len("Error: "):]  # click prints it after "Error: "
            raise
        except (click.exceptions.Abort, click.exceptions.Exit):
            raise
        except KeyboardInterrupt:
            _echo("commdiag: interrupted", err=True)
            sys.exit(errors.EXIT_INTERRUPTED)
        except Exception as e:
            if ctx.params.get("debug"):
                raise
            _echo(_unexpected(e, ctx.invoked_subcommand), err=True)
            sys.exit(errors.EXIT_USAGE)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="commdiag")
@click.option("--debug", is_flag=True, envvar="COMMDIAG_DEBUG",
              help="Show the full traceback of an unexpected error (also COMMDIAG_DEBUG=1).")
@click.option("--allow-user-files", is_flag=True,
              help="As root: read profiles, specs, rules, run folders and recordings that another user can "
                   "change (refused by default: their owner would choose what root reads, installs or runs, "
                   "and could change them while commdiag works). Install allowlists still apply.")
def main(debug: bool, allow_user_files: bool) -> None:
    """NCCL/PCIe communication diagnostics: do NCCL settings make your model's all-reduce faster, by more
    than the noise (certified on fresh launches), and do they reach every worker.

    \b
    On a GPU box, in this order (README.md, "On your GPU box"):
      commdiag doctor                           the machine: topology, hooks, env
      commdiag sweep sweeps/nvlink2-aa.yaml     A/A check: must certify nothing
      commdiag sweep sweeps/pcie8.yaml          the sweep (7-9 min, 8 GPUs)
      commdiag report reports/RUN               report.html and the verdicts
      commdiag install-hook --from reports/RUN  persist a certified winner
      commdiag check-env                        did the settings arrive here
    On a CPU machine: commdiag sweep sweeps/cpu-smoke.yaml (16 s, docs/times.md)."""
    from . import readfile

    readfile.allow_others(allow_user_files)


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
    stage2 = l.get("stage") == 2
    where = f"stage 2 round {l['round'] + 1}" if stage2 else f"trial {l['trial']}"
    # the ETA: this stage's launches left x the mean of its launches so far, on this machine
    return (f"[{bar}] {p.done}/{p.total}  {l['config']} {where}: {l['status']}{extra} "
            f"in {l.get('wall_s', 0):.1f}s  {'ETA' if stage2 else 'screening ETA'} {_fmt_s(p.eta_s)}")


@main.command(short_help="Time all-reduce per NCCL config; certify the winner.")
@click.argument("spec_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a spec key, e.g. --set trials=5 or --set base_env.NCCL_P2P_DISABLE=1.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              help="Run folder (default: reports/<UTC timestamp>-<name>/).")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Continue an interrupted run folder; finished launches are not redone.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
@click.option("--explain", is_flag=True,
              help="After timing, one untimed launch per config with NCCL's TUNING log: what NCCL chose (GPU).")
@click.option("--no-confirm", is_flag=True,
              help="Stop after screening (stage 1): estimates only, no certified verdict, no profile; "
                   "commdiag confirm RUN_DIR certifies later.")
@click.option("--certify-sizes", is_flag=True,
              help="Also certify every config x size (one-stage exact test, paired by trial): raises trials "
                   "to what that needs (9-18 launches per config); the cost is printed before the first launch.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (launches per stage, at most how many stage-2 rounds) and its expected wall "
                   "time from recorded launch costs; launch nothing.")
def sweep(spec_file, sets, out, resume, as_json, explain, no_confirm, certify_sizes, dry_run):
    """Run an all-reduce sweep over NCCL settings (one fresh launch per config and trial), then
    confirm the screening's candidates on fresh launches (stage 2) for a certified answer."""
    if resume is None and spec_file is None:
        raise click.UsageError("give a SPEC_FILE, or --resume RUN_DIR")
    if dry_run:
        if resume is not None:
            raise click.UsageError("--dry-run plans a new sweep from a SPEC_FILE, not a --resume")
        from .formats import spec as spec_mod
        from .measure import sweep as sweep_mod

        plan = sweep_mod.dry_run(spec_mod.load_spec(spec_file, sets))
        if as_json:
            _echo(json.dumps({"format": "commdiag-sweep-plan", "version": 1, "launches": plan.launches,
                              "expected_s": plan.est_s, "lines": list(plan.lines)}, indent=1), wrap=False)
        else:
            for line in plan.lines:
                _echo(line)
        return
    if resume is not None and (spec_file is not None or sets or out is not None or no_confirm or certify_sizes):
        # the run folder holds its spec; anything given beside it would be silently ignored
        raise click.UsageError("--resume RUN_DIR continues that run with its recorded spec; "
                               "do not give a SPEC_FILE, --set, --out, --no-confirm or --certify-sizes with it")
    res = _run_spec(spec_file, sets, out, resume, as_json, step=False, no_confirm=no_confirm,
                    certify_sizes=certify_sizes, explain=explain)
    _finish_run(res, as_json)


@main.command("step", short_help="A TP step per NCCL config: is communication the bottleneck?")
@click.argument("spec_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a spec key, e.g. --set model.layers=8 or --set base_env.NCCL_P2P_DISABLE=1.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              help="Run folder (default: reports/<UTC timestamp>-<name>/).")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Continue an interrupted step run; finished launches are not redone.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
@click.option("--no-confirm", is_flag=True,
              help="Stop after screening: estimates only; commdiag confirm RUN_DIR certifies later.")
def step_cmd(spec_file, sets, out, resume, as_json, no_confirm):
    """Time a synthetic tensor-parallel step (the spec's model: block) per NCCL config: the step, the same step
    without its all-reduces and the all-reduces alone, graph and eager.  Prints the all-reduces' share of the
    step and, certified as in sweep, whether a config changes the step time (docs/step.md)."""
    if resume is None and spec_file is None:
        raise click.UsageError("give a SPEC_FILE, or --resume RUN_DIR")
    if resume is not None and (spec_file is not None or sets or out is not None or no_confirm):
        raise click.UsageError("--resume RUN_DIR continues that run with its recorded spec; "
                               "do not give a SPEC_FILE, --set, --out or --no-confirm with it")
    _finish_run(_run_spec(spec_file, sets, out, resume, as_json, step=True, no_confirm=no_confirm), as_json)


def _run_spec(spec_file, sets, out, resume, as_json, *, step: bool, no_confirm: bool, certify_sizes: bool = False,
              explain: bool = False):
    """What sweep and step share: load the spec (a step spec has model:, a sweep spec has not), print its
    warnings, run both stages with progress lines."""
    from .formats import spec as spec_mod
    from .measure import sweep as sweep_mod

    spec = None
    if resume is None:
        spec = spec_mod.load_spec(spec_file, sets)
        if step and not spec.model:
            raise errors.CommdiagError(f"{spec_file}: model: missing; commdiag step needs the layer's shape "
                                       "(docs/step.md); for an all-reduce sweep use  commdiag sweep")
        if not step and spec.model:
            raise errors.CommdiagError(f"{spec_file}: model: this is a step spec (a synthetic TP layer); run it "
                                       f"with  commdiag step {spec_file}")
        for w in spec.warnings:
            _echo(f"commdiag: warning: {w}", err=True)
    progress = None if as_json else (lambda p: _echo(_progress_line(p), err=True))
    return sweep_mod.run_sweep(spec, run_dir=out, resume=resume, on_progress=progress, on_plan=_print_plan,
                               confirm=not no_confirm, certify_sizes=certify_sizes, explain=explain)


def _step_table(data):
    """(text, JSON) of commdiag step's table for a step run folder, else None."""
    if not data.run["spec"].get("model"):
        return None
    from .analyse import steptable, verdict

    rows = steptable.step_rows(verdict.run_values(data), data.run)
    return steptable.render(rows), steptable.to_json(rows)


def _print_plan(plan) -> None:
    for line in plan.lines:
        _echo(line, err=True)


def _finish_run(res, as_json: bool) -> None:
    """What sweep and confirm print at the end: the table, the two-stage answer, report and profiles
    (published by the library: an interrupted run has none of them)."""
    from .analyse import report, verdict
    from .formats import results

    data = results.load_run(res.run_dir)
    pub = res.published
    step = _step_table(data)
    if as_json:
        _echo(json.dumps({"format": "commdiag-sweep-result", "version": verdict.VERDICTS_VERSION, "run_dir": str(res.run_dir),
                               "state": res.state, "launches": res.counts,
                               "summary": json.loads(data.summary.to_json(orient="records")),
                               "verdicts": pub.verdicts.to_json() if pub else None,
                               "report": str(pub.report) if pub and pub.report else None,
                               "profiles": [str(res.run_dir / p) for p in pub.profiles] if pub else [],
                               **({"step": step[1]} if step else {})}, indent=1), wrap=False)
    else:
        _echo(render_table(data))
        if step:
            _echo("\n" + step[0])
        if pub:
            _echo("\n" + report.render_verdicts(pub.verdicts))
            _echo(f"\nreport: {pub.report or pub.report_note}")
            _echo("profiles: " + (", ".join(str(res.run_dir / p) for p in pub.profiles) if pub.profiles
                                       else "none (no certified winner: keep NCCL defaults)"))
        _echo(f"\nrun folder: {res.run_dir}   launches: "
                   + ", ".join(f"{v} {k}" for k, v in sorted(res.counts.items())))
        if res.state == "interrupted":
            _echo("interrupted: no verdicts, report or profile from a partial run; continue with  "
                       f"commdiag sweep --resume {res.run_dir}")
    if res.state == "interrupted":
        sys.exit(errors.EXIT_INTERRUPTED)
    sys.exit(errors.EXIT_OK if res.all_ok else errors.EXIT_LAUNCHES_FAILED)


@main.command("ab", short_help="A/B of your own benchmark: better, worse or equivalent?",
              context_settings={"ignore_unknown_options": True})
@click.argument("spec_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a spec key, e.g. --set rounds=10.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              help="Run folder (default: reports/<UTC timestamp>-ab-<name>/).")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Continue an interrupted ab run folder; finished launches are not redone.")
@click.option("--config", "configs", multiple=True, metavar="NAME=PROFILE",
              help="One-line form: an arm from a profile.env (repeatable); the command follows --.")
@click.option("--metric", "metrics", multiple=True, metavar="NAME:higher|lower:REGEX | PRESET:FIELD",
              help="One-line form: a metric from the command's stdout, or a preset's field (repeatable).")
@click.option("--rounds", default=None, help="One-line form: rounds (default auto).")
@click.option("--min-effect", type=float, default=None, help="One-line form: smallest change worth it (0.03).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def ab_cmd(spec_file, command, sets, out, resume, configs, metrics, rounds, min_effect, as_json):
    """Run your own benchmark command (and server) per NCCL config, interleaved in shuffled rounds, and
    certify each metric against default: better, worse, equivalent within min_effect, or inconclusive
    with the rounds that would decide it (docs/ab.md)."""
    from .ab import render, runner, spec as ab_spec

    quick = bool(configs or metrics or command)
    if resume is not None and (spec_file or sets or out or quick):
        raise click.UsageError("--resume RUN_DIR continues that run with its recorded spec; give nothing else")
    spec = None
    if resume is None:
        if quick:
            argv = ([str(spec_file)] if spec_file else []) + list(command)
            spec = ab_spec.quick(argv, list(configs), list(metrics), rounds, min_effect)
        elif spec_file is None:
            raise click.UsageError("give a SPEC_FILE, --resume RUN_DIR, or --config/--metric -- CMD ARGS")
        else:
            spec = ab_spec.load(spec_file, sets)
        for w in spec.warnings:
            _echo(f"commdiag: warning: {w}", err=True)
    progress = None if as_json else (lambda p: _echo(_ab_progress(p), err=True))
    res = runner.run_ab(spec, run_dir=out, resume=resume, on_progress=progress,
                        on_start=None if as_json else (lambda line: _echo(line, err=True)))
    run = runner.load(res.run_dir)
    # analysed and report.html written by the library, like sweep's: a complete run only
    a = res.published.analysis if res.published else render.analyse(run)
    page = res.published.report if res.published else None
    if as_json:
        _echo(json.dumps(render.to_json(res.run_dir, run, a, res.counts, page), indent=1))
    else:
        _echo(render.render_text(run, a))
        if page is not None:
            _echo(f"\nreport: {page}")
        _echo(f"\nrun folder: {res.run_dir}   launches: " + ", ".join(f"{v} {k}" for k, v in sorted(res.counts.items())))
        if res.state == "interrupted":
            _echo(f"interrupted: no verdicts from a partial run; continue with  commdiag ab --resume {res.run_dir}")
        elif res.state == "stopped":
            _echo(f"stopped: {run['stopped']}. No verdicts from no values: fix it and run again "
                  f"(commdiag ab --resume {res.run_dir} runs the rest with the recorded spec)")
    if res.state == "interrupted":
        sys.exit(errors.EXIT_INTERRUPTED)
    sys.exit(errors.EXIT_OK if set(res.counts) <= {"ok"} else errors.EXIT_LAUNCHES_FAILED)


def _ab_progress(p) -> str:
    l = p.launch
    extra = f" ({l.get('error', '')[:60]})" if l["status"] != "ok" else ""
    return (f"[{p.done}/{p.total}] {l['config']} round {l['round'] + 1}: {l['status']}{extra} "
            f"in {l.get('wall_s', 0):.1f}s  ETA {_fmt_s(p.eta_s)}")[:100]


@main.command("confirm", short_help="Stage 2 of a run: confirm its candidates on fresh launches.")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--rounds", type=click.IntRange(3, 200), default=None,
              help="Rounds of stage 2 (default: the fewest at which the paired test can certify every claim, "
                   "plus 2 spare). On a confirmed run: add this many rounds (a further look, tested at half of "
                   "what the earlier looks left of the 1%).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
def confirm_cmd(run_dir, rounds, as_json):
    """Stage 2 on an existing run: confirm the screening's candidates on fresh launches (or finish or extend it)."""
    from .measure import sweep as sweep_mod

    progress = None if as_json else (lambda p: _echo(_progress_line(p), err=True))
    res = sweep_mod.run_confirm(run_dir, rounds=rounds, on_progress=progress, on_plan=_print_plan)
    _finish_run(res, as_json)


@main.command("explain", short_help="What NCCL chose: algorithm, protocol, channels, transports.")
@click.argument("run_dir", nargs=-1, type=click.Path(path_type=Path))
@click.option("--log", "logs", multiple=True, metavar="FILE",
              help="Explain a saved NCCL log (NCCL_DEBUG=INFO) of any process instead of a run: one file per rank "
                   "or one combined file; every file after one --log is a log too (--log logs/*.log).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--no-run", is_flag=True, help="Only show what an earlier explain stored; launch nothing.")
def explain_cmd(run_dir, logs, as_json, no_run):
    """What NCCL chose (algorithm, protocol, channels) per config and size of an nccl run (GPU machine), and
    the transport it connected each GPU pair with (P2P, SHM, NET), per config and against default.

    One untimed launch per config with NCCL's TUNING log. NCCL >= 2.24 logs names and channel ranges;
    older versions log numeric ids (mapped to names, channels unknown) or nothing, which is said plainly.
    A gloo run is refused: gloo never loads NCCL.

    --log FILE...: explain a saved NCCL log of any process (e.g. your inference server's, with
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV): version, the NCCL_* values NCCL applied, the transport
    per GPU pair, rings and trees, tuner plugin lines. Nothing is launched."""
    if logs:
        if no_run or any(p.is_dir() for p in run_dir):
            raise click.UsageError("--log FILE explains a saved log; do not give a RUN_DIR or --no-run with it "
                                   "(for a folder of logs: --log DIR/*.log)")
        from .nccl import logreport

        rep = logreport.explain_logs([*logs, *run_dir])  # "--log a.log b.log": the shell's dir/*.log
        if as_json:
            _echo(json.dumps({"format": logreport.LOG_FORMAT, "version": logreport.LOG_VERSION, **rep.to_json()},
                             indent=1))
        else:
            _echo(logreport.render(rep))
        return
    if not run_dir:
        raise click.UsageError("give a RUN_DIR, or --log FILE for a saved NCCL log")
    if len(run_dir) > 1:
        raise click.UsageError(f"one RUN_DIR at a time (got {len(run_dir)}); saved NCCL logs go after --log")
    run_dir = run_dir[0]
    if not run_dir.is_dir():
        raise click.UsageError(f"RUN_DIR {run_dir}: " + ("not a folder (a saved NCCL log? --log FILE)"
                                                       if run_dir.exists() else "no such folder"))
    from .measure import explain as explain_mod
    from .formats import results

    run = results.load_run_json(run_dir)
    if no_run:
        data = explain_mod.stored(run_dir, run)
    else:
        data = explain_mod.run_explain(run_dir)
    if as_json:
        _echo(json.dumps({"format": "commdiag-explain", "version": 1, **data}, indent=1), wrap=False)
    else:
        _echo(explain_mod.render(data, run["spec"]["sizes"]))


@main.command("report", short_help="Write a run's HTML report and print its verdicts.")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="HTML file to write (default: RUN_DIR/report.html).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON instead of the table.")
def report_cmd(run_dir, out, as_json):
    """Write the HTML report of a run folder (offline, one file) and print the verdicts; never measures.
    A sweep's run folder or an ab run's (docs/ab.md)."""
    from .analyse import report
    from .atomic import check_target

    if out is not None:
        check_target(out)  # a FIFO, device, link or missing folder: refuse before any work
    from .ab import report as ab_report

    if ab_report.is_ab_run(run_dir):
        _ab_report(run_dir, out, as_json)
        return
    from .analyse import verdict
    from .formats import results

    data = results.load_run(run_dir)  # once: the report and the step table read the same run
    path, verdicts = report.write_report(run_dir, out, data=data)
    step = _step_table(data)
    if as_json:
        _echo(json.dumps({"format": "commdiag-verdicts", "version": verdict.VERDICTS_VERSION, "run_dir": str(run_dir),
                               "report": str(path), "verdicts": verdicts.to_json(),
                               **({"step": step[1]} if step else {})}, indent=1), wrap=False)
    else:
        if step:
            _echo(step[0] + "\n")
        _echo(report.render_verdicts(verdicts))
        _echo(f"\nreport: {path}")


def _ab_report(run_dir: Path, out: Path | None, as_json: bool) -> None:
    """``commdiag report`` on an ab run folder: its report.html, and the verdicts as ab prints them."""
    from .ab import render, report as ab_report, runner

    run = runner.load(run_dir)
    path, a = ab_report.write_report(run_dir, out, run=run)
    if as_json:
        _echo(json.dumps(render.to_json(run_dir, run, a, render.counts(run), path), indent=1))
    else:
        _echo(render.render_text(run, a))
        _echo(f"\nreport: {path}")


@main.command("compare", short_help="Did run B change against run A, beyond launch noise?")
@click.argument("run_a", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("run_b", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the comparison as an HTML file.")
def compare_cmd(run_a, run_b, as_json, html_out):
    """Compare two run folders: per config x size x mode, did B change beyond the noise of either run?"""
    from .analyse import compare
    from .atomic import check_target, write_text

    if html_out is not None:
        check_target(html_out)
    res = compare.run(run_a, run_b)
    if html_out:
        write_text(html_out, compare.build_html(res))
    if as_json:
        _echo(json.dumps(res.to_json(), indent=1), wrap=False)
    else:
        _echo(compare.render_text(res))
        if html_out:
            _echo(f"\nhtml: {html_out}")


@main.command("trace", short_help="Your server's profiler trace: is communication the bottleneck?")
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--step", "step", metavar="REGEX",
              help="The CPU annotation that is one step (default: ProfilerStep#N, else a numbered annotation, "
                   "else each CUDA graph launch).")
@click.option("--sweep", "sweep_dir", type=click.Path(file_okay=False, path_type=Path), metavar="RUN_DIR",
              help="A sweep's run folder: what its certified winner would save of this step at most.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the answer as an offline HTML page with a timeline per rank.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (format commdiag-trace).")
def trace_cmd(traces, step, sweep_dir, html_out, as_json):
    """Read the Kineto traces your server wrote (torch.profiler, SGLang --profile, vLLM
    VLLM_TORCH_PROFILER_DIR; .json or .json.gz, files or folders, one file per rank) and say whether
    communication is the bottleneck: per rank and step, GPU time split into compute, NCCL by
    collective, memory copies and idle; the exposed communication; the idle time the CPU caused
    (a launch-bound eager step); all-reduce sizes and what NCCL chose; the straggler per step.
    Never imports torch and never measures (docs/trace.md)."""
    from . import trace as trace_mod

    if html_out is not None:
        from .atomic import check_target
        from .trace import page

        check_target(html_out)
        page.check_plotly()
    rep = trace_mod.analyse_paths(traces, step=step, sweep=sweep_dir)
    if html_out is not None:
        from .atomic import write_text
        from .trace import page

        write_text(html_out, page.build_html(rep))
    if as_json:
        _echo(json.dumps(rep.to_json(), indent=1), wrap=False)
    else:
        from .trace import render

        _echo(render.render(rep))
        if html_out is not None:
            _echo(f"\nhtml: {html_out}")


def render_table(data, values=None) -> str:
    """The sweep's table (analyse/sweeptable.py); ``values``: the run's launch values when already computed."""
    from .analyse import sweeptable, verdict

    return sweeptable.render(data, verdict.run_values(data) if values is None else values)


# --------------------------------------------------------------------------- check-env / detect / doctor


def _envelope(fmt: str, body: dict) -> str:
    return json.dumps({"format": f"commdiag-{fmt}", "version": 1, **body}, indent=1, default=str)


def _var_line(v) -> str:
    exp = "-" if v.expected is None else v.expected
    line = f"  {v.status.upper():10} {v.name:24} expected={exp!s:12} environ={v.environ!s:12} getenv={v.getenv!s}"
    # the detail on its own line: the row stays within 100 columns for ordinary values
    return line.rstrip() + (f"\n             {v.detail}" if v.detail and v.status != "ok" else "")


@main.command("nodes", short_help="Slurm: which node or link is slower than the rest (certified).")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="nccl", show_default=True,
              help="nccl: GPU 0 of each node, over the network NCCL picks; gloo: CPU sockets.")
@click.option("--bytes", "nbytes", type=click.IntRange(4, 1 << 30), default=4 << 20, show_default=True,
              help="All-reduce size per call.")
@click.option("--iters", type=click.IntRange(1, 10000), default=20, show_default=True, help="Timed calls per pair and round.")
@click.option("--warmup", type=click.IntRange(0, 10000), default=3, show_default=True,
              help="Untimed calls per pair and round before the timed ones.")
@click.option("--rounds", type=click.IntRange(1, 200), default=None,
              help="Fresh launches (default: the fewest that can certify at 1% over every claim, plus 2).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 86400), default=300.0, show_default=True,
              help="Deadline of one round's launch, seconds.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run folder (default reports/nodes-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print nodes.json's verdicts as JSON.")
def nodes_cmd(backend, nbytes, iters, warmup, rounds, timeout_s, out, as_json):
    """Inside a Slurm allocation of 3+ nodes: time the same all-reduce between every node pair (one fresh
    launch per round, pairs in a shuffled order) and name the nodes and links slower than the rest by more
    than 3%, certified at 1% family-wise; an A/A fleet names nobody (docs/multinode.md).  Exit 1 if one is."""
    from .measure import nodes

    def progress(done, total, entry):
        state = "ok" if entry.get("values") else ("timeout" if entry["timed_out"] else f"failed (exit {entry['exit_code']})")
        _echo(f"round {done}/{total}: {state} in {entry['wall_s']:.1f}s", err=True)

    r = nodes.run_nodes(run_dir=out or nodes.default_run_dir(), backend=backend, nbytes=nbytes, warmup=warmup,
                        iters=iters, rounds=rounds, deadline_s=timeout_s, on_round=progress)
    if as_json:
        _echo(_envelope("nodes", {"run_dir": str(r.run_dir), "findings": r.record["findings"],
                                  "rounds": len(r.record["rounds"])}), wrap=False)
    else:
        _echo("\n".join(nodes.render(r)))
        _echo(f"run folder: {r.run_dir}")
    sys.exit(errors.EXIT_CHECK_FAILED if r.slow else errors.EXIT_OK)


@main.command("check-env", short_help="Did the NCCL settings arrive in this process (or children)?")
@click.option("--expect", "expects", multiple=True, metavar="NAME=VALUE", help="Expected value (repeatable).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Expect the settings of a commdiag profile (a sweep's RUN_DIR/profile.env).")
@click.option("--var", "extra_vars", multiple=True, metavar="NAME", help="Also report this variable (repeatable).")
@click.option("--propagation", is_flag=True,
              help="Start children every way frameworks do (fork, spawn, forkserver, subprocess, torchrun) "
                   "and report what arrived in each.")
@click.option("--no-torchrun", is_flag=True,
              help="With --propagation: skip the two torchrun paths (a torchrun worker and its spawn grandchild).")
@click.option("--nccl", "nccl", is_flag=True,
              help="GPU machine: bring NCCL up (NCCL_DEBUG=INFO, SUBSYS=ENV,INIT) and compare what it applied, per "
                   "rank; show the transport NCCL connected each GPU pair with.")
@click.option("--nproc", type=int, default=None,
              help="With --nccl: ranks (one process per GPU) to start (default: every visible GPU).")
@click.option("--nodes", "nodes", is_flag=True,
              help="Inside a Slurm allocation: one task per node checks what arrived there (expected: --expect, "
                   "--profile, else this shell's NCCL_* variables and the installed hook's); exit 1 if any node "
                   "lacks them (docs/multinode.md).")
@click.option("--conf-root", type=click.Path(file_okay=False), default=None, hidden=True,
              help="Read nccl.conf files under this staged root (tests).")
@click.option("--libs", is_flag=True,
              help="Which libnccl torch and SGLang's/vLLM's PyNccl load in this interpreter's environment "
                   "(SGLANG_NCCL_SO_PATH, VLLM_NCCL_SO_PATH, else libnccl.so.2); exit 1 on a version mismatch. "
                   "Starts this interpreter isolated (-I) and imports torch there: seconds. doctor --python PY "
                   "does the same for PY.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_env_cmd(expects, profile_path, extra_vars, propagation, no_torchrun, nccl, nproc, nodes, conf_root, libs,
                  as_json):
    """Did the NCCL settings arrive in this process (os.environ and libc getenv)? Exit 1 if not."""
    from .environment import envcheck, propagation as propagation_mod

    expect = envcheck.parse_assignments(expects)
    if nodes:  # every node of the Slurm allocation (environment/nodecheck.py)
        if nccl or propagation or libs:
            raise click.UsageError("--nodes is a check of its own; run it without --nccl, --propagation or --libs")
        from .environment import nodecheck

        nodes_report = nodecheck.check_nodes(expect, profile=profile_path)
        if as_json:
            _echo(_envelope("check-env-nodes", nodes_report.to_json()), wrap=False)
        else:
            _echo("\n".join(nodecheck.render(nodes_report)))
        sys.exit(errors.EXIT_OK if nodes_report.ok else errors.EXIT_CHECK_FAILED)
    if libs:  # a check of its own: which libnccl this interpreter's processes load (environment/ncclib.py)
        if nccl or propagation or expects or profile_path or extra_vars:
            raise click.UsageError("--libs is a check of its own; run it without --nccl, --propagation, --expect, "
                                   "--profile or --var")
        from .environment import ncclib

        lib_report = ncclib.probe()
        if as_json:
            _echo(_envelope("nccl-libraries", lib_report.to_json()))
        else:
            _echo("\n".join(ncclib.render(lib_report, indent="")))
        sys.exit(errors.EXIT_CHECK_FAILED if lib_report.mismatches() or lib_report.error else errors.EXIT_OK)
    if nccl:
        r = envcheck.check_nccl(expect, profile=profile_path, nproc=nproc, conf_root=conf_root)
        if as_json:
            _echo(_envelope("check-env-nccl", r.to_json()), wrap=False)
        else:
            _echo(f"NCCL's own view (NCCL_DEBUG_SUBSYS=ENV,INIT), {envcheck.describe_expectation(r.source)}:")
            if r.debug_note:
                _echo(f"  note: {r.debug_note}")
            for rank in r.ranks:
                _echo(f" rank {rank.rank if rank.rank is not None else '?'} pid {rank.pid} GPU {rank.device} "
                           f"NCCL {rank.version}: {'ok' if rank.ok else 'FAIL'}")
                for c in rank.checks:
                    _echo(f"  {c.status.upper():11} {c.name:24} expected={c.expected!s:12} applied={c.getenv!s}")
            if not r.ranks:
                _echo(f"  NCCL printed no ENV lines (exit {r.exit_code}):\n{r.log_tail}")
            if r.transports is not None and r.ranks:  # what NCCL connected each GPU pair with (INIT lines)
                from .nccl import transports

                _echo(" transport per GPU pair (row: sending GPU, column: receiving GPU):")
                _echo("\n".join(transports.render_matrix(r.transports)))
            if r.tuner is not None:  # NCCL_TUNER_PLUGIN was set: did it load, which rule fired (docs/tuner.md)
                _echo("\n".join(envcheck.render_tuner(r.tuner)))
            for c in r.conf_files:
                _echo(f" config {c.path}: " + (", ".join(f"{k}={v}" for k, v in c.settings.items()) or "empty")
                           if c.exists else f" config {c.path}: absent")
        sys.exit(errors.EXIT_OK if r.ok else errors.EXIT_CHECK_FAILED)
    if propagation:
        r = propagation_mod.check_propagation(expect, profile=profile_path, torchrun=not no_torchrun)
        if as_json:
            _echo(_envelope("check-env-propagation", r.to_json()), wrap=False)
        else:
            _echo(propagation_mod.render(r))
        sys.exit(errors.EXIT_OK if r.ok else errors.EXIT_CHECK_FAILED)
    r = envcheck.check_env(expect, profile=profile_path, names=extra_vars, conf_root=conf_root)
    if as_json:
        _echo(_envelope("check-env", r.to_json()), wrap=False)
    else:
        _echo(f"pid {r.pid} {r.executable}")
        _echo(envcheck.describe_expectation(r.source))
        for v in r.vars:
            _echo(_var_line(v))
        if not r.vars:
            _echo("  no NCCL_* variables set, none expected")
        _echo("ok" if r.ok else f"FAIL: {len(r.failures)} variable(s) did not arrive as expected")
    sys.exit(errors.EXIT_OK if r.ok else errors.EXIT_CHECK_FAILED)


def _load_readings(path):
    from . import readfile

    if path is None:
        return None
    try:
        data = json.loads(readfile.read_text(path, 64 << 20, what="NVML recording"))
    except (OSError, ValueError) as e:
        raise errors.CommdiagError(f"{path}: cannot read NVML recording: {e}") from None
    # a `commdiag detect --json` output is a recording too
    return data.get("nvml_readings", data) if isinstance(data, dict) else data


_SYSFS_ROOT_HELP = ("Read the PCIe/IOMMU state from this captured tree (it holds sys/ and proc/cmdline, as "
                    "--capture-sysfs writes) instead of this machine's /sys.")


@main.command(short_help="Startup hooks, GPU topology (NVML), ACS/IOMMU, versions.")
@click.option("--python", "pythons", multiple=True, metavar="PATH",
              help="Also probe this interpreter (e.g. the inference server's venv python); repeatable.")
@click.option("--nvml-replay", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Analyse an NVML recording (nvml-readings.json or a `detect --json` output) instead of NVML.")
@click.option("--sysfs-root", type=click.Path(file_okay=False, exists=True), default=None, metavar="DIR",
              help=_SYSFS_ROOT_HELP)
@click.option("--capture-sysfs", type=click.Path(), default=None, metavar="DIR",
              help="Copy the sysfs files the PCIe/IOMMU audit reads into the new folder DIR, for a bug report "
                   "(run as root to include ACS).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (it embeds the NVML readings).")
def detect(pythons, nvml_replay, sysfs_root, capture_sysfs, as_json):
    """Python startup hooks per interpreter, GPU topology (NVML), ACS/IOMMU (sysfs), versions."""
    from .environment import detect as detect_mod

    d = detect_mod.detect(pythons, nvml_readings=_load_readings(nvml_replay), sysfs_root=sysfs_root or "/")
    if capture_sysfs:
        from .environment import sysfscapture

        c = sysfscapture.capture(capture_sysfs, sysfs_root or "/", nvml_bus_ids=[g.bus_id for g in d.topology.gpus])
        _echo("\n".join(detect_mod.wrapped("", f"captured {c.files} files, {c.links} links, {c.dirs} folders under "
                                                f"{c.path}; read it back with `commdiag detect --sysfs-root "
                                                f"{c.path}`", "")), err=as_json)
    _echo(_envelope("detect", d.to_json()) if as_json else detect_mod.render(d), wrap=not as_json)
    sys.exit(errors.EXIT_OK if d.ok else errors.EXIT_CHECK_FAILED)


@main.command(short_help="Health report: topology, startup hooks, NCCL env; what to do.")
@click.option("--python", "pythons", multiple=True, metavar="PATH", help="Also probe this interpreter; repeatable.")
@click.option("--expect", "expects", multiple=True, metavar="NAME=VALUE", help="Expected value (repeatable).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Expect the settings of a commdiag profile.")
@click.option("--nvml-replay", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Use an NVML recording instead of NVML.")
@click.option("--sysfs-root", type=click.Path(file_okay=False, exists=True), default=None, metavar="DIR",
              help=_SYSFS_ROOT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(pythons, expects, profile_path, nvml_replay, sysfs_root, as_json):
    """detect + check-env as one ranked health report; exit 1 if anything needs attention."""
    from .environment import doctor as doctor_mod, envcheck

    r = doctor_mod.doctor(pythons, expect=envcheck.parse_assignments(expects), profile=profile_path,
                          nvml_readings=_load_readings(nvml_replay), sysfs_root=sysfs_root or "/")
    _echo(_envelope("doctor", r.to_json()) if as_json else doctor_mod.render(r), wrap=not as_json)
    sys.exit(errors.EXIT_OK if r.healthy else errors.EXIT_CHECK_FAILED)


@main.command("p2p", short_help="Every GPU pair: data check, bandwidth, latency, flags.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (format commdiag-p2p).")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), help="Also write an HTML page.")
@click.option("--from", "from_json", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Show a result saved with --json instead of measuring.")
@click.option("--size-mib", type=click.IntRange(1, 4096), default=256, show_default=True, help="MiB per copy.")
@click.option("--repeats", type=click.IntRange(3, 100), default=7, show_default=True, help="Timed copies per value.")
@click.option("--pair-timeout", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="Seconds a pair (or a GPU's host copies) may take before it is reported hung.")
@click.option("--min-fraction", type=click.FloatRange(0, 1), default=0.6, show_default=True,
              help="Flag a copy below this fraction of its link's ceiling.")
def p2p_cmd(as_json, html_out, from_json, size_mib, repeats, pair_timeout, min_fraction):
    """Measure every visible GPU pair (docs/p2p.md): peer access, data check, P2P and through-host
    bandwidth and latency against the link's ceiling; each pair under its own deadline. Exit 1 on a flag."""
    from .p2p import render, run, result

    if html_out is not None:
        run.check_html(html_out)
    if from_json is not None:
        ctx = click.get_current_context()
        given = [n for n in ("size_mib", "repeats", "pair_timeout", "min_fraction")
                 if ctx.get_parameter_source(n) != click.core.ParameterSource.DEFAULT]
        if given:  # a saved result is shown as measured: these would be silently ignored
            raise click.UsageError("--from shows a saved result; do not give --" + ", --".join(
                n.replace("_", "-") for n in given) + " with it")
        res = run.load(from_json)
    else:
        settings = result.Settings(size_bytes=size_mib << 20, repeats=repeats, pair_timeout_s=pair_timeout,
                                   min_fraction=min_fraction)
        res = run.measure(settings, on_job=None if as_json else (
            lambda o: _echo(f"p2p: {o.id}: {o.status}" + (f" in {o.wall_s:.1f}s" if o.wall_s else ""), err=True)))
    if html_out is not None:
        run.write_html(res, html_out)
    _echo(json.dumps(res.to_json(), indent=1) if as_json else render.render(res))
    if html_out is not None and not as_json:
        _echo(f"html: {html_out}")
    sys.exit(errors.EXIT_OK if res.ok else errors.EXIT_CHECK_FAILED)


@main.command("install-hook", short_help="Persist settings: Python hook, systemd, nccl.conf; exact undo.")
@click.option("--from", "from_dir", type=click.Path(file_okay=False, path_type=Path), metavar="RUN_DIR",
              help="Install the sweep's winner (RUN_DIR/profile.env); refused when there is none, unless --force.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path), help="Install a profile file.")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE", help="A setting (repeatable; on top of --from/--profile).")
@click.option("--tuner", "tuner_path", type=click.Path(path_type=Path), metavar="RUN_DIR|RULES",
              help="Also install commdiag's tuner plugin (compiled here) and these rules (a rules file, or a run "
                   "folder's certified winners) in commdiag's state directory, and set NCCL_TUNER_PLUGIN and "
                   "NCCL_TUNER_CONFIG_FILE to them.")
@click.option("--cc", "cc", metavar="COMPILER",
              help="With --tuner: the C compiler (default: $CC or cc; as root cc in /usr/bin or /bin, with "
                   "no $PATH, $CC or compiler variables from your environment).")
@click.option("--python", "python", metavar="PATH", help="Target interpreter (default: this one).")
@click.option("--allow-user-owned", is_flag=True,
              help="As root: a target whose files another user can change is refused (starting it would run "
                   "their code as root); with this it is started as that user and installed into anyway.")
@click.option("--method", type=click.Choice(["auto", "pth", "sitecustomize", "none"]), default=None,
              help="Python hook method; auto (the default) chooses from what detect finds; none: no Python hook. "
                   "With --systemd or --nccl-conf and no --python, the default is none: only what was asked for.")
@click.option("--systemd", "systemd_unit", metavar="UNIT", help="Also write a drop-in for this systemd unit.")
@click.option("--systemd-env-file", is_flag=True, help="With --systemd: EnvironmentFile= instead of Environment= lines.")
@click.option("--nccl-conf", type=click.Choice(["system", "user"]), is_flag=False, flag_value="system", default=None,
              help="Also write NCCL's config file: /etc/nccl.conf (system, the default) or ~/.nccl.conf (user).")
@click.option("--override", is_flag=True, help="Set the variables even when already set (default: a value already set wins).")
@click.option("--force", is_flag=True, help="Install without a sweep winner; replace a file that is not commdiag's.")
@click.option("--root", type=click.Path(file_okay=False), help="Write system paths under DIR instead of / (staging, tests).")
@click.option("--status", "show_status", is_flag=True, help="What is installed where, and whether it loads now.")
@click.option("--uninstall", is_flag=True, help="Restore exactly what was there before, from the manifest.")
@click.option("--all", "all_installs", is_flag=True, help="With --uninstall: every recorded install.")
@click.option("--dry-run", is_flag=True, help="Print the plan (files, content, diffs) and change nothing.")
@click.option("--python-flag", "python_flags", multiple=True, metavar="FLAG",
              help="With --status: a flag the service starts the interpreter with (-S, -I, ...); repeatable.")
@click.option("--no-verify", is_flag=True,
              help="Do not start the target interpreter after installing to check that every value arrives "
                   "(for a target that cannot run here, e.g. a staged --root).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def install_hook_cmd(from_dir, profile_path, sets, tuner_path, cc, python, allow_user_owned, method, systemd_unit,
                     systemd_env_file, nccl_conf, override, force, root, show_status, uninstall, all_installs,
                     dry_run, python_flags, no_verify, as_json):
    """Persist NCCL settings: a Python startup hook (.pth or sitecustomize), a systemd drop-in, nccl.conf."""
    from .install import hook

    if show_status and uninstall:
        raise click.UsageError("--status and --uninstall exclude each other")
    if cc is not None and tuner_path is None:
        raise click.UsageError("--cc names the compiler of --tuner's plugin; give it with --tuner")
    if tuner_path is not None and (show_status or uninstall):
        raise click.UsageError("--tuner installs; --status shows, and --uninstall removes, the tuner files with "
                               "the install that names them")
    if show_status:
        expected = None
        if from_dir or profile_path or sets:
            expected = hook.resolve_settings(from_dir, profile_path, sets, force=True).values
        res = hook.status(python=python, flags=python_flags, root=root, expected=expected,
                          allow_user_owned=allow_user_owned)
        _echo(json.dumps(res.to_json(), indent=1) if as_json else hook.render_status(res), wrap=not as_json)
        sys.exit(errors.EXIT_OK if res.ok else errors.EXIT_CHECK_FAILED)
    if method is None:
        method = "none" if (systemd_unit or nccl_conf) and python is None else "auto"
    if uninstall:
        res = hook.uninstall(python=python, method=method, systemd_unit=systemd_unit, nccl_conf=nccl_conf,
                             all_installs=all_installs, root=root, force=force, dry_run=dry_run,
                             allow_user_owned=allow_user_owned)
    else:
        tuner = hook.prepare_tuner(tuner_path, root, cc) if tuner_path is not None else None
        settings = hook.resolve_settings(from_dir, profile_path, sets, force=force, tuner=tuner)
        req = hook.Request(settings, python=python, method=method, systemd_unit=systemd_unit,
                           systemd_env_file=systemd_env_file, nccl_conf=nccl_conf, override=override, force=force,
                           root=root, tuner=tuner, allow_user_owned=allow_user_owned)
        res = hook.install(req, dry_run=dry_run, verify=not no_verify)
    if as_json:
        _echo(json.dumps(res.to_json(), indent=1), wrap=False)
    else:
        _echo_verbatim(hook.render_install(res), res.diff if res.dry_run else "")
    sys.exit(errors.EXIT_OK if res.ok else errors.EXIT_CHECK_FAILED)


@main.group("tuner", short_help="NCCL tuner plugin: per-size algorithm/protocol rules.")
def tuner_group() -> None:
    """commdiag's NCCL tuner plugin: stock NCCL applies per-size algorithm/protocol rules from a file
    (docs/tuner.md).  Building it needs a C compiler (cc)."""


@tuner_group.command("build", short_help="Compile the plugin with cc; print the env lines that load it.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for libnccl-tuner-commdiag.so (created if missing), e.g. ~/.local/lib/commdiag; "
                   "required: a library NCCL loads belongs where you chose, not in whatever folder the shell is "
                   "in (as root: a folder no other user can change).")
@click.option("--rules", "rules_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A rules file to check (as the plugin reads it) and name in NCCL_TUNER_CONFIG_FILE.")
@click.option("--cc", "cc", metavar="COMPILER",
              help="The C compiler (default: $CC or cc; as root cc in /usr/bin or /bin, with no $PATH, $CC "
                   "or compiler variables from your environment).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tuner_build_cmd(out_dir, rules_path, cc, as_json):
    """Compile commdiag's tuner plugin with the system C compiler (cc, or $CC) and print the lines
    that make NCCL load it: NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE, absolute paths."""
    from .tuner import build, rules

    if out_dir is None and os.geteuid() != 0:  # root: build.py's own refusal says what root needs
        raise click.UsageError("give --out DIR, the folder for libnccl-tuner-commdiag.so (e.g. "
                               "~/.local/lib/commdiag): commdiag writes no library into the current folder")
    n_rules = len(rules.load(rules_path)) if rules_path is not None else None
    res = build.build_result(out_dir, cc=cc)
    _echo(json.dumps(res.to_json(rules_path), indent=1) if as_json else build.render(res, rules_path, n_rules),
          wrap=not as_json)
    sys.exit(errors.EXIT_OK)


@tuner_group.command("rules", short_help="Rules from a run's certified per-size winners (sweep --certify-sizes).")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rules file here (atomically); only when there is at least one rule.")
@click.option("--allow-ll128", is_flag=True,
              help="Allow LL128 rules when the run records no GPU topology (you know every pair is NVLink).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tuner_rules_cmd(run_dir, out, allow_ll128, as_json):
    """Turn the certified per-size winners of a PROTO x ALGO (x channels) sweep run with --certify-sizes
    into tuner rules: adjacent sizes with the same winner merge, nothing uncertified becomes a rule, and
    choices NCCL would ignore or that are unsafe here are refused (docs/tuner.md "Rules from a sweep")."""
    from .atomic import check_target, write_text
    from .tuner import fromrun

    if out is not None:
        check_target(out)  # a FIFO, device, link or missing folder: refuse before any work
    res = fromrun.derive(run_dir, allow_ll128=allow_ll128)
    written = None
    if out is not None and res.rules:
        write_text(out, res.text)
        written = out
    if as_json:
        _echo(json.dumps({**res.to_json(), "written": None if written is None else str(written)}, indent=1),
              wrap=False)
    else:
        _echo(fromrun.render(res, written if res.rules else out))
    sys.exit(errors.EXIT_OK)


if __name__ == "__main__":
    main()
