"""User-facing error type and the exit-code table.

One error type for what the user can fix (asv's pattern): it is raised deep in
the library and caught once, in the CLI, which prints it and exits with its code.
Everything else keeps its traceback.
"""

from __future__ import annotations

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
