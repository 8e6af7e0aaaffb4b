"""User-facing error type and the exit-code table.

One error type for what the user can fix (asv's pattern): it is raised deep in
the library and caught once, in the CLI, which prints it and exits with its code.
Everything else keeps its traceback.
"""

from __future__ import annotations

import re
import reprlib

# Exit codes: a short documented table (README "Exit codes").
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # a check ran and found a problem (check-env, detect, doctor)
EXIT_USAGE = 2  # bad spec, bad option, missing prerequisite (click uses 2 too)
EXIT_LAUNCHES_FAILED = 3  # the sweep finished but some launches failed/timed out/were wrong
EXIT_INTERRUPTED = 130  # Ctrl-C: the run folder is resumable (128 + SIGINT, shell convention)


class CommdiagError(Exception):
    """An error the user can fix; the message names the file, field and what is allowed."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class SpecError(CommdiagError):
    """A sweep spec that cannot be run: ``FILE: FIELD: problem (allowed: ...)``."""

    def __init__(self, path: str, field: str, problem: str):
        self.path, self.field, self.problem = str(path), field, problem
        super().__init__(f"{path}: {field}: {problem}")


# What an error message may quote of a value the user gave: a YAML alias bomb or a 200 MB
# line must never be rendered whole (reprlib stops at these sizes without walking the rest).
_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 6
_BRIEF.maxlevel = 3


def brief(value) -> str:
    """A bounded ``repr`` of ``value`` for error messages (at most about 80 characters per string)."""
    text = _BRIEF.repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


# C0 and C1 control characters, DEL, and the Unicode line/paragraph separators that
# str.splitlines() and some terminals treat as line breaks; newline and tab are kept.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def text_lines(text: str) -> str:
    """``text`` with carriage returns as line breaks: a progress bar's redrawn states (``\\r``) read as
    the lines a terminal showed one after another, where a page cannot redraw (report.html)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def one_line(text) -> str:
    """Text read from a file another program wrote (a run.json's verdicts, a name in it) as one inert
    line: control characters as ``terminal_safe`` shows them, and line breaks and tabs escaped too
    (``\\n``), so it can neither move the cursor nor print a line of its own that looks like
    commdiag's ("installed ... verify: OK")."""
    return terminal_safe(str(text)).replace("\n", "\\n").replace("\t", "\\t")


def terminal_safe(text: str) -> str:
    """``text`` with every control character except newline and tab shown as ``\\xNN``:
    what a config name or a hostile interpreter's stderr may put on a terminal (OSC titles,
    clear screen, cursor moves) is printed, never obeyed."""
    return _TERMINAL_UNSAFE.sub(lambda m: ascii(m.group())[1:-1], str(text))
