"""Every line commdiag prints fits 100 columns: the one wrapping rule the CLI applies to all text.

A line that fits is left exactly as it is (tables are laid out to fit and are never
touched).  A longer line is wrapped at spaces, never inside a word, with a hanging
indent: the continuation lines start under the line's own indentation plus four
spaces, so a wrapped verdict or warning still reads as one item.

Two kinds of span are kept whole when they fit on a line of their own:

* a command, written after two spaces (``continue with  commdiag sweep --resume RUN``),
  up to the next two spaces or the end of the line: commdiag's messages set commands
  off this way so that they can be copied whole;
* a backquoted span (`` `pip install -e .` ``).

A single word longer than the line (a long path) is never cut: it stands whole on a
line of its own, which a terminal folds but a copy-paste keeps intact.  A line that is
itself a shell command (``sudo ...``, ``export ...``, ``commdiag sweep ...``, no ": " in it) is wrapped
with a trailing `` \\`` on each broken line, so that it still pastes as one command.

Not wrapped, by the CLI's choice: JSON (``--json``) and the verbatim content of files
(install-hook's diff), where a line break would change what is shown.
Pure: text in, text out.
"""

from __future__ import annotations

import re

WIDTH = 100
HANG = 4  # continuation lines: the line's own indentation plus this many spaces

# A unit: a backquoted span (with what is glued to it), or one word.
_WORD = re.compile(r"\S*`[^`]*`\S*|\S+")
# A shell word: quoted parts are never broken (a line continuation inside quotes would be literal).
_SHELL_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")


def fit(text: str, width: int = WIDTH) -> str:
    """``text`` with every line longer than ``width`` wrapped (see the module docstring)."""
    return "\n".join(out for line in str(text).split("\n") for out in fit_line(line, width))


def fit_line(line: str, width: int = WIDTH) -> list[str]:
    """One line as the lines it becomes: itself when it fits, else wrapped with a hanging indent."""
    if len(line) <= width:
        return [line]
    line = line.rstrip()
    if len(line) <= width:
        return [line]
    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    hang = indent + " " * HANG
    if len(hang) > width // 2:  # a deeply indented line: continue under its text, not further right
        hang = indent if len(indent) <= width // 2 else " " * (width // 2)
    shell = _is_shell_line(body)
    if shell:  # every broken line ends in " \\": the room is two columns less
        width -= 2
    out: list[str] = []
    cur = indent
    fresh = True  # nothing but indentation on the current line yet
    for sep, phrase in (_words(body) if shell else _phrases(body)):
        room = width - len(cur) - (0 if fresh else len(sep))
        if len(phrase) <= room:
            cur, fresh = (cur if fresh else cur + sep) + phrase, False
            continue
        if len(hang) + len(phrase) <= width:  # whole on the next line
            out.append(cur)
            cur, fresh = hang + phrase, False
            continue
        if " " in phrase and not fresh:  # a command longer than a line: at least it starts on its own
            out.append(cur)
            cur, fresh = hang, True
        for word in (_SHELL_WORD if shell else _WORD).findall(phrase):  # longer than any line: word by word
            room = width - len(cur) - (0 if fresh else 1)
            if len(word) <= room or fresh:
                cur, fresh = (cur if fresh else cur + " ") + word, False
            else:
                out.append(cur)
                cur, fresh = hang + word, False
    out.append(cur)
    out = [l.rstrip() for l in out if l.strip()] or [line]
    if shell:
        out = [l + " \\" for l in out[:-1]] + out[-1:]
    return out


def _words(body: str) -> list[tuple[str, str]]:
    return [(" ", w) for w in _SHELL_WORD.findall(body)]


def _phrases(body: str) -> list[tuple[str, str]]:
    """(separator, phrase) pairs: words, except that a command set off by two spaces and a
    backquoted span are one phrase each."""
    out: list[tuple[str, str]] = []
    chunks = re.split(r"( {2,})", body)  # odd items: runs of two or more spaces
    for n in range(0, len(chunks), 2):
        chunk = chunks[n]
        if not chunk:
            continue
        sep = chunks[n - 1] if n else ""
        if sep and _is_command(chunk):
            out.append((sep, chunk))
            continue
        for i, word in enumerate(_WORD.findall(chunk)):
            out.append((sep if i == 0 else " ", word))
    return out


_COMMAND = re.compile(r"(sudo|commdiag [a-z][a-z-]*|export|systemctl|python3?|\S*/(pip|python3?|commdiag)) ")


def _is_command(chunk: str) -> bool:
    """A span after two spaces that reads as a command line (what the user would copy)."""
    return bool(_COMMAND.match(chunk))


_SHELL_LINE = re.compile(r"(sudo|export|systemctl|commdiag [a-z][a-z-]*)( |$)")


def _is_shell_line(body: str) -> bool:
    """A whole line that is a command to copy (``sudo ...``, ``commdiag sweep ...``): wrapped with shell
    line continuations.  Not a status line that starts with a word like one ("python PATH: ...")."""
    return bool(_SHELL_LINE.match(body)) and "  " not in body and ": " not in body
