"""How long the node's reads of containerd and apt may take, and how much of an answer is read (no I/O).

Each of these programs answers in a second or two on a sound node; on a sick one (an import on a hung
mount, a binary stuck in the kernel, apt's index on a failing disk) it may never answer, and the run would
wait for that node alone. The node's programs leave such a read behind after these seconds and say so
(``timeout`` exits 124), and the node fails naming what did not answer.
"""

import os

from pyinfra_gpunode import node_toml

VERSION_SECONDS = 10  # containerd --version
DUMP_SECONDS = 60  # containerd config dump, of the node's files or of a candidate tree (dump_seconds)
DUMP_SECONDS_RANGE = (1, 3600)
APT_SECONDS = 300  # apt-cache madison, apt-get --print-uris
JOURNAL_SECONDS = 30  # a journal read (containerd's signals, its CRI lines, the kernel's Xid events): what it
# found by then is what is judged (the shell programs write the same number: a journal read never fails a node)
DUMP_BYTES = node_toml.MAX_BYTES + 1  # of a dump's output: one byte more than node_toml reads, so it says so
TIMED_OUT = 124  # timeout's exit status for a program it ended
TIMED_OUT_LINE = "### gpunode-timeout"  # what a read prints in place of an answer that did not come in time


_UNANSWERED = " did not answer within "


def did_not_answer(program: str, seconds: int) -> str:
    """The node's failure when ``program`` was left behind after ``seconds``."""
    return f"{program}{_UNANSWERED}{seconds} s: left behind, and this node not read further"


def unanswered(error: str | None) -> bool:
    """Whether a read's ``error`` is ``did_not_answer``'s: nothing may be judged from that read."""
    return error is not None and _UNANSWERED in error and error.endswith("this node not read further")


def dump_seconds() -> int:
    """How long a ``containerd config dump`` may take: ``DUMP_SECONDS``, or the controller's
    ``GPUNODE_DUMP_SECONDS`` where set (a fleet whose nodes read large trees from slow disks, or one that
    should give up sooner); anything but whole seconds in ``DUMP_SECONDS_RANGE`` is a ``ValueError``
    naming it."""
    text = os.environ.get("GPUNODE_DUMP_SECONDS")
    if text is None:
        return DUMP_SECONDS
    low, high = DUMP_SECONDS_RANGE
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise ValueError(f"GPUNODE_DUMP_SECONDS={text[:40]!r}: give whole seconds from {low} to {high}")
    return int(text)
