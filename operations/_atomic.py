"""Write a file on the node atomically (upload beside it, set owner and mode, rename); fail a host."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from io import StringIO

from pyinfra import host, state
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand

from pyinfra_gpunode.log import logger


def write_file(
    dest: str, text: str, mode: str = "644", user: str = "root", group: str = "root"
) -> Iterator[FileUploadCommand | StringCommand]:
    temp = f"{dest}.gpunode-new"
    yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(dest)))
    if not int(mode, 8) & 0o004:
        # Not for everyone's eyes (e.g. registry credentials): the upload fills a file made for owner only.
        yield StringCommand(
            "rm", "-f", QuoteString(temp), "&&", "(", "umask", "077", "&&", ":", ">", QuoteString(temp), ")"
        )
    yield FileUploadCommand(StringIO(text), temp)
    yield StringCommand(
        "chown",
        QuoteString(f"{user}:{group}"),
        QuoteString(temp),
        "&&",
        "chmod",
        QuoteString(mode),
        QuoteString(temp),
        "&&",
        "mv",
        "-f",
        QuoteString(temp),
        QuoteString(dest),
    )


def fail(message: str) -> StringCommand:
    """A command that fails this host with ``message`` on stderr and changes nothing.

    In a dry run (the prepare pass) the message is printed as this node's plan: the gate that blocks.
    """
    if not state.is_executing:
        logger.warning("%splan: %s", host.print_prefix, message)
    return StringCommand("printf", "'%s\\n'", QuoteString(message), ">&2", "&&", "exit", "1")
