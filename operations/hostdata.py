"""Fail a node whose host data was refused, before anything runs on it."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import operation

from pyinfra_gpunode.operations._atomic import fail


@operation()
def accepted(error: str = "") -> Generator[Any, Any, None]:
    """
    Fail this node with the reason its host data was refused; nothing is run on it.

    + error: why the host data was refused, naming the key; empty when it was accepted

    A dry run prints the refusal as the node's plan and changes nothing.

    **Example:**

    .. code:: python

        hostdata.accepted(name="host data: accepted",
                          error="host-data key 'gpunode_driver_source' must be one of: ...")
    """
    if not error:
        host.noop("host data is accepted")
        return
    yield fail(error)
