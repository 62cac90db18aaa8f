"""Every CDI spec on a node is checked: driver, device nodes, format for the node's containerd, and which
spec wins a device defined twice; from real fact outputs (nvidia-ctk's spec, the device plugin's JSON)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pyinfra_gpunode.cdi_checks import containerd_needed, shadowed, untrue_specs
from pyinfra_gpunode.readiness import BROKEN, OK, assess
from tests.unit.test_readiness import BINARY, SPEC, healthy

TESTS = Path(__file__).resolve().parents[1]
DRIVER = "580.159.04"  # the H200's, in the fixtures
NODES = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]


def fixture(name: str) -> Any:
    return copy.deepcopy(json.loads((TESTS / "facts" / f"{name}.json").read_text())["fact"])


def specs() -> list[dict[str, Any]]:
    """nvidia-ctk's spec in /etc/cdi and the device plugin's own JSON spec in /var/run/cdi, as read."""
    return fixture("cdi.CdiSpecs/device_plugin_json")


def containerd(name: str) -> dict[str, Any]:
    return fixture(f"containerd.ContainerdVersion/{name}")


def test_specs_for_the_loaded_driver_with_their_device_nodes_are_true() -> None:
    assert untrue_specs(specs(), DRIVER, NODES, containerd("debian_1_7"), None) == []  # type: ignore[arg-type]


def test_a_device_plugin_spec_for_another_driver_is_named_with_a_device_plugin_restart() -> None:
    found = specs()
    found[1]["driver_versions"] = ["570.86.15"]
    (problem,) = untrue_specs(found, DRIVER, NODES, containerd("debian_1_7"), None)  # type: ignore[arg-type]
    assert problem.path == "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
    assert problem.problem == f"names driver 570.86.15 in its paths, but {DRIVER} is loaded"
    assert problem.fix.startswith("restart the NVIDIA device plugin pod on this node")


def test_a_spec_naming_a_device_node_that_does_not_exist_is_named() -> None:
    (problem,) = untrue_specs(specs()[:1], DRIVER, NODES[1:], containerd("debian_1_7"), None)  # type: ignore[arg-type]
    assert problem.path == "/etc/cdi/nvidia.yaml"
    assert problem.problem == "names device node(s) /dev/nvidia-uvm that do not exist"
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in problem.fix


def test_device_nodes_not_read_are_not_held_against_a_spec() -> None:
    assert untrue_specs(specs(), DRIVER, None, containerd("debian_1_7"), None) == []  # type: ignore[arg-type]


def test_cdi_version_0_7_0_needs_containerd_1_7_16() -> None:
    assert containerd_needed("0.7.0") == containerd_needed("0.8.0") == (1, 7, 16)
    assert containerd_needed("0.6.0") is None and containerd_needed("x") is None
    found = specs()[:1]
    found[0]["cdi_version"] = "0.7.0"
    assert untrue_specs(found, DRIVER, NODES, containerd("debian_1_7"), None) == []  # type: ignore[arg-type]
    (problem,) = untrue_specs(found, DRIVER, NODES, containerd("debian_1_6"), None)  # type: ignore[arg-type]
    assert problem.problem == (
        "is cdiVersion 0.7.0, which containerd 1.6.20 cannot read (it needs containerd 1.7.16 or later)"
    )


def test_a_device_defined_in_two_directories_is_won_by_the_later_one() -> None:
    found = specs()[:1]
    found.append({**found[0], "path": "/var/run/cdi/nvidia.yaml"})
    (problem,) = shadowed(found, None)  # type: ignore[arg-type]
    assert problem.path == "/etc/cdi/nvidia.yaml"
    assert problem.problem == "defines nvidia.com/gpu=0, shadowed by /var/run/cdi/nvidia.yaml (a later directory wins)"
    # containerd's cdi_spec_dirs decide the order: listed the other way round, /etc/cdi wins.
    (problem,) = shadowed(found, ["/var/run/cdi", "/etc/cdi"])  # type: ignore[arg-type]
    assert problem.path == "/var/run/cdi/nvidia.yaml"


def test_a_device_defined_twice_in_one_directory_is_refused() -> None:
    found = specs()[:1]
    found.append({**found[0], "path": "/etc/cdi/nvidia-other.yaml"})
    (problem,) = shadowed(found, None)  # type: ignore[arg-type]
    assert problem.problem.endswith("in the same directory: the device is refused")


def test_the_readiness_chain_names_every_untrue_spec_with_its_fix() -> None:
    facts = healthy()
    assert {link.id: link.state for link in assess("gpu1", facts, BINARY, SPEC).links}["cdi_specs"] == OK
    facts["cdi"].append({**facts["cdi"][0], "path": "/var/run/cdi/nvidia.yaml", "driver_versions": ["570.86.15"]})
    link = assess("gpu1", facts, BINARY, SPEC).first_broken
    assert link is not None and link.id == "cdi_specs" and link.state == BROKEN
    assert link.detail == "2 of 2 spec(s) stale or shadowed: /etc/cdi/nvidia.yaml, /var/run/cdi/nvidia.yaml"
    assert link.cause is not None and link.fix is not None
    assert "/var/run/cdi/nvidia.yaml names driver 570.86.15 in its paths" in link.cause
    assert "/etc/cdi/nvidia.yaml defines nvidia.com/gpu=0, shadowed by /var/run/cdi/nvidia.yaml" in link.cause
    assert "/var/run/cdi/nvidia.yaml: regenerate it: `nvidia-ctk cdi generate" in link.fix
