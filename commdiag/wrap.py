"""Console lines within 100 columns: a longer line continues on lines indented 4 more than its own."""

from __future__ import annotations

import textwrap

WIDTH = 100


def wrapped(lines, width: int = WIDTH) -> list[str]:
    """Every line of ``lines`` within ``width`` columns (continuations indented under their line)."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        # a word longer than the width (a path) stays whole: it must still copy and paste
        out += textwrap.wrap(line, width, subsequent_indent=lead + "    ", break_on_hyphens=False,
                             break_long_words=False)
    return out
