"""Read the project's pyinfra facts through a testinfra host: the fact's own command, then its
own ``process``, so the checks judge nodes with exactly the logic the deploys use."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

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


def has_gpu(node: Node) -> bool:
    return bool(node.host.file("/sys/module/nvidia").is_directory)
