"""The project's logger (a child of pyinfra's, so the pyinfra CLI prints its messages), and how a message
shows a value read from a node."""

import logging
import re

logger = logging.getLogger("pyinfra.gpunode")

_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
SHOWN_MAX = 80  # characters of a value read from a node that a message shows


def printable(text: str) -> str:
    """``text`` with every character outside printable ASCII shown as ``<U+001B>`` (no escape for a
    terminal or a shell to act on)."""
    return _UNPRINTABLE.sub(lambda match: f"<U+{ord(match.group()):04X}>", text)


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1


def without_controls(text: str) -> str:
    """``text`` with each control character (C0, DEL, C1: a newline, a terminal's escape) shown as ``<U+000A>``;
    other characters as they are."""
    return CONTROL.sub(lambda match: f"<U+{ord(match.group()):04X}>", text)


def shown(value: str, limit: int = SHOWN_MAX) -> str:
    """A value read from a node as a message may show it: quoted and ``printable``, cut after ``limit``
    characters (then ``…`` and its full length)."""
    return f"'{printable(value[:limit])}'" + (f"… ({len(value)} characters)" if len(value) > limit else "")
