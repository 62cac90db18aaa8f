"""Keep NVIDIA persistence mode as asked: ``nvidia-persistenced`` enabled and running, or stopped."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, StringCommand, operation

from pyinfra_gpunode.facts.driver import NvidiaDriver
from pyinfra_gpunode.facts.gpus import NvidiaGpus
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.persistence import MODES, UNIT, unit_change, wanted
from pyinfra_gpunode.settings import PERSISTENCE_MODE


@operation()
@locked_before_changes
def persistence_mode(mode: str = PERSISTENCE_MODE) -> Generator[Any, Any, None]:
    """
    Keep persistence mode as asked: ``nvidia-persistenced.service`` enabled and running (``on``), or
    disabled and stopped (``off``); ``auto`` is ``on`` on a node with a datacenter GPU (PCI class 3D
    controller) and ``off`` otherwise. Nothing on a node without an NVIDIA GPU. Where the unit is not
    installed or is masked, persistence mode cannot be turned on: the plan says so and nothing changes.
    The unit's start is verified (``systemctl is-active``); the readiness report checks each GPU
    through NVML.

    + mode: ``auto``, ``on`` or ``off``

    **Example:**

    .. code:: python

        persistence.persistence_mode(name="NVIDIA persistence mode: as asked", mode="on")
    """
    if mode not in MODES:
        raise OperationValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    want = wanted(mode, [gpu["class"] for gpu in node_fact(NvidiaGpus)["gpus"]])
    if want is None:
        host.noop("no NVIDIA GPU: persistence mode not asked")
        return
    verb, problem = unit_change(want, node_fact(NvidiaDriver)["persistenced"])
    if problem:
        logger.warning("%splan: %s", host.print_prefix, problem)
        host.noop(problem)
        return
    if verb is None:
        host.noop(f"persistence mode {'on' if want else 'off'}: {UNIT} is as asked")
        return
    if verb == "enable":  # the start verified: a daemon that exits at once (no GPU it can open) fails here
        yield StringCommand(f"systemctl enable --now {UNIT} && systemctl is-active --quiet {UNIT}")
    else:
        yield StringCommand(f"systemctl disable --now {UNIT}")
