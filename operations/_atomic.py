"""Write a file on the node atomically (beside it, owner and mode set, then renamed over it); fail a host."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand

from pyinfra_gpunode import shell
from pyinfra_gpunode.log import logger

_WRITE = shell.script(Path(__file__).parent / "shell" / "write-file.sh")


def write_file(
    dest: str, text: str, mode: str = "644", user: str = "root", group: str = "root"
) -> Iterator[StringCommand]:
    """One command that writes ``text`` to ``dest`` atomically with ``mode`` and owner (shell/write-file.sh):
    the text comes on stdin, so neither its size nor its content reaches the command line."""
    encoded = base64.b64encode(text.encode()).decode()
    yield StringCommand(shell.command(_WRITE, "gpunode-write", dest, f"{user}:{group}", mode), _stdin=encoded)


def fail(message: str) -> StringCommand:
    """A command that fails this host with ``message`` on stderr and changes nothing.

    In a dry run (the prepare pass) the message is printed as this node's plan: the gate that blocks.
    """
    if not state.is_executing:
        logger.warning("%splan: %s", host.print_prefix, message)
    return StringCommand("printf", "'%s\\n'", QuoteString(message), ">&2", "&&", "exit", "1")
