"""Shell programs shipped as files in the package, run on the node as ``sh -c <text> <name> <args...>``.

A program longer than a line lives in a shellcheck-clean ``*.sh`` file next to the module that
runs it (``operations/shell/``, ``facts/shell/``); the node gets its text without the comment
lines, and every argument quoted.
"""

from __future__ import annotations

import shlex
from pathlib import Path


def script(path: Path) -> str:
    """The shell file at ``path`` without its comment and blank lines: the text the node runs.

    Only whole-line comments are dropped, so a file must hold no here-document or multi-line
    quoted text with a line that starts with ``#`` or is blank.
    """
    return "\n".join(
        line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


class Expanded(str):
    """An argument the calling shell expands, e.g. ``Expanded('"$cfg"')`` for a variable an earlier part of
    the same command set: ``command`` passes it as written, unquoted."""


def command(script_text: str, name: str, *args: str) -> str:
    """``sh -c`` running ``script_text`` as ``$0`` ``name`` with positional ``args``, each quoted (an
    ``Expanded`` one as written)."""
    words = ["sh", "-c", script_text, name, *args]
    return " ".join(word if isinstance(word, Expanded) else shlex.quote(word) for word in words)
