"""Leave the NVIDIA GPU Operator's layers to it: fail a node where the deploy would fight it."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import operation

from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._atomic import fail


@operation()
def handed_over(refusal: str = "", notes: list[str] | None = None) -> Generator[Any, Any, None]:
    """
    Fail this node, before anything changes on it, where the GPU Operator owns a layer the deploy
    would write (its toolkit's nvidia runtime, its driver container); otherwise say who owns what.

    + refusal: why the deploy would fight the operator on this node and what to change; empty when it would not
    + notes: what the plan says about the operator's layers (a driver from its driver container, a runtime
      taken over with ``gpunode_take_over_runtime``)

    A dry run prints the refusal as the node's plan and changes nothing.

    **Example:**

    .. code:: python

        operator.handed_over(name="GPU Operator: host side handed over",
                             notes=["driver 580.95.05 from the GPU Operator's driver container"])
    """
    if refusal:
        yield fail(refusal)
        return
    for note in notes or []:
        logger.info("%splan: %s", host.print_prefix, note)
    host.noop("; ".join(notes or []) or "the GPU Operator writes none of the layers the deploy manages")
