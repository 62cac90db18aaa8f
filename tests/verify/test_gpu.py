"""The GPU side of a ready node: a CDI spec generated for the driver that is loaded now."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.facts.cdi import CdiSpecs
from pyinfra_gpunode.facts.nvidia import NvidiaDriver

from .facts import has_gpu, read_fact
from .inventory import Node


def test_cdi_spec_matches_loaded_driver(node: Node) -> None:
    if not has_gpu(node):
        pytest.skip(f"{node.name}: no GPU driver loaded (/sys/module/nvidia missing)")
    driver = read_fact(node, NvidiaDriver)
    specs = [spec for spec in read_fact(node, CdiSpecs) if spec["kind"] == "nvidia.com/gpu"]
    assert specs, "no nvidia.com/gpu CDI spec in /etc/cdi or /var/run/cdi"
    stale = [s["path"] for s in specs if s["driver_version"] != driver["kernel_module_version"]]
    assert not stale, f"CDI specs not for the loaded driver {driver['kernel_module_version']}: {stale}"
