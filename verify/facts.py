"""Read the project's pyinfra facts through a testinfra host: the fact's own command, then its
own ``process``, so the checks judge nodes with exactly the logic the deploys use."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api import FactBase

from pyinfra_gpunode.facts.gpus import NvidiaGpus

from .inventory import Node


def read_fact(node: Node, fact_class: type[FactBase[Any]], **arguments: Any) -> Any:
    fact = fact_class()
    required = fact.requires_command(**arguments)
    if required and node.host.run(f"command -v {required}").rc != 0:
        return None
    result = node.host.run(fact.command(**arguments))
    assert result.rc == 0, f"{fact_class.__name__} failed on {node.name}: {result.stderr}"
    lines = result.stdout.splitlines()
    return fact.process(lines) if lines else fact.default()


def gpu_count(node: Node) -> int:
    """NVIDIA GPUs on the node's PCI bus; skips the calling check on a node without any."""
    count = len(read_fact(node, NvidiaGpus)["gpus"])
    if not count:
        pytest.skip(f"{node.name}: no NVIDIA GPU on the PCI bus")
    return count
