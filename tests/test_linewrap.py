"""linewrap.fit: every printed line fits 100 columns, wrapped at spaces with a hanging indent (pure)."""

from __future__ import annotations

from commdiag.linewrap import WIDTH, fit, fit_line

# the verdict line a CPU sweep printed at 372 columns (certify.py's wording at the time)
VERDICT = ("  seed band decode (eager): not certified - keep NCCL defaults: p = 0.71 with 6 launches per arm "
           "(smallest attainable p = 0.0011, needed <= 0.005); launch noise 48.7%; if the true effect were 35% "
           "(the screening estimate, at least 3%), about 47 launches per arm would give 80% power at this noise: "
           "an effect this small cannot be certified at a sane cost on this machine")


def test_a_line_that_fits_is_left_exactly_as_it_is():
    row = "   size(B)   tok mode         config          " + " " * 10
    assert len(row) <= WIDTH and fit_line(row) == [row]
    table = "a  b\n    c    d\n\n"
    assert fit(table) == table


def test_a_long_line_wraps_at_spaces_under_its_own_indentation_plus_four():
    lines = fit(VERDICT).split("\n")
    assert len(lines) > 1 and all(len(l) <= WIDTH for l in lines)
    assert lines[0].startswith("  seed band decode") and all(l.startswith("      ") and l[6] != " " for l in lines[1:])
    # nothing lost, nothing cut: the words are the same words in the same order
    assert " ".join(" ".join(lines).split()) == " ".join(VERDICT.split())


def test_a_word_longer_than_the_line_stands_whole_on_its_own_line():
    path = "/srv/" + "x" * 120 + "/run.json"
    lines = fit_line(f"commdiag: error: {path}: no measured data; restore it from a copy")
    assert lines[0] == "commdiag: error:" and lines[1] == f"    {path}:"
    assert all(len(l) <= WIDTH for l in lines[2:])


def test_a_command_after_two_spaces_is_kept_whole_on_one_line():
    run = "reports/2026-11-30T12:00:00Z-cpu-smoke-with-a-long-name"
    line = ("interrupted: no verdicts, report or profile from a partial run (this one had 18 launches left); "
            f"continue with  commdiag sweep --resume {run}")
    lines = fit_line(line)
    assert lines[-1].endswith(f"  commdiag sweep --resume {run}") and all(len(l) <= WIDTH for l in lines)
    # a backquoted span too
    lines = fit_line("x " * 44 + "then run `pip install --no-deps /path/to/commdiag` in that venv")
    assert any("`pip install --no-deps /path/to/commdiag`" in l for l in lines)


def test_a_command_longer_than_a_line_starts_on_its_own_line():
    run = "/tmp/" + "r" * 90
    lines = fit_line(f"stage 1 unfinished; continue with  commdiag sweep --resume {run}")
    assert lines == ["stage 1 unfinished; continue with", "    commdiag sweep --resume", f"    {run}"]


def test_a_shell_command_line_wraps_with_continuations_and_never_inside_quotes():
    line = ("  sudo \"$(command -v commdiag)\" install-hook --from reports/2026-11-30T12:00:00Z-cpu-smoke "
            "--python /opt/sglang/venv/bin/python --set NCCL_PROTO='LL 128 with spaces'")
    lines = fit_line(line)
    assert len(lines) == 2 and lines[0].endswith(" \\") and all(len(l) <= WIDTH for l in lines)
    assert "'LL 128 with spaces'" in lines[1]
    # what the shell reads: the same command
    assert " ".join(l.rstrip("\\").strip() for l in lines).split() == line.split()


def test_deep_indentation_never_pushes_the_text_off_the_line():
    line = " " * 70 + "word " * 20
    assert all(len(l) <= WIDTH for l in fit_line(line))


def test_trailing_spaces_alone_never_make_a_line_wrap():
    assert fit_line("x" * 90 + " " * 30) == ["x" * 90]
