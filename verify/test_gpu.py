"""The GPU side of a ready node: the driver loaded and coherent, NVML seeing every GPU, Fabric Manager
on NVSwitch systems, the toolkit's runtime, and a CDI spec for the loaded driver listing every GPU.
Nodes without an NVIDIA GPU on the PCI bus skip these checks."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from pyinfra_gpunode.cdi_checks import missing_devices
from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.cdi import CdiRefreshUnits, CdiSpecs, refresh_installed
from pyinfra_gpunode.facts.driver import NvidiaDriver
from pyinfra_gpunode.facts.fabric_manager import NvidiaFabricManager
from pyinfra_gpunode.facts.gpus import NvidiaGpus
from pyinfra_gpunode.facts.nvml import NvmlInfo
from pyinfra_gpunode.facts.operator import GpuOperatorState
from pyinfra_gpunode.hostdata import settings as settings_of
from pyinfra_gpunode.operator import driver_from_container
from pyinfra_gpunode.toolkit_plan import REFRESH_SPEC, cdi_owner

from .facts import gpu_count, read_fact
from .inventory import Node


def _loaded_driver(node: Node) -> str:
    version = read_fact(node, NvidiaDriver)["kernel_module_version"]
    assert version, f"{node.name} has NVIDIA GPUs but no NVIDIA kernel module is loaded"
    return str(version)


def _nvml(node: Node) -> dict[str, Any]:
    nvml = read_fact(node, NvmlInfo)
    if nvml is None:
        pytest.skip(f"{node.name}: python3 with pynvml (nvidia-ml-py) is not on the node; NVML not checked")
    assert nvml["error"] is None, f"NVML on {node.name} fails: {nvml['error']}"
    return dict(nvml)


def test_driver_loaded_and_matches_userspace(node: Node) -> None:
    gpu_count(node)
    loaded = _loaded_driver(node)
    userspace = read_fact(node, NvidiaDriver)["userspace_version"]
    assert userspace, f"no libnvidia-ml.so.1 found by the loader (module {loaded} loaded)"
    assert userspace == loaded, f"kernel module {loaded} but userspace library {userspace}: a reboot is pending"


def test_nvml_driver_matches_module(node: Node) -> None:
    gpu_count(node)
    loaded = _loaded_driver(node)
    nvml = _nvml(node)
    assert nvml["driver_version"] == loaded, f"NVML reports driver {nvml['driver_version']}, module {loaded} is loaded"


def test_nvml_sees_every_pci_gpu(node: Node) -> None:
    count = gpu_count(node)
    devices = _nvml(node)["devices"]
    assert len(devices) == count, f"NVML sees {len(devices)} GPU(s), the PCI bus has {count}"


def test_fabric_manager_active_on_nvswitch_nodes(node: Node) -> None:
    gpu_count(node)
    if not read_fact(node, NvidiaGpus)["nvswitch"]:
        pytest.skip(f"{node.name}: no NVSwitch")
    state = read_fact(node, NvidiaFabricManager)
    assert state["active"] == "active", f"nvidia-fabricmanager.service is {state['active'] or 'not installed'}"


def test_toolkit_runtime_binary_present(node: Node) -> None:
    gpu_count(node)
    binary = settings_of(node.data).runtime.binary
    assert node.host.run(f"test -x {shlex.quote(binary)}").rc == 0, f"{binary} is missing or not executable"


def test_cdi_spec_current_and_lists_every_gpu(node: Node) -> None:
    count = gpu_count(node)
    loaded = _loaded_driver(node)
    cdi = settings_of(node.data).cdi
    units = refresh_installed(read_fact(node, CdiRefreshUnits))
    container = units and driver_from_container(read_fact(node, NvidiaDriver), read_fact(node, GpuOperatorState))
    owner, _ = cdi_owner(cdi.owner, units, container)
    path = REFRESH_SPEC if owner == "refresh" else cdi.spec_path  # the spec its owner writes
    spec = {item["path"]: item for item in read_fact(node, CdiSpecs)}.get(path)
    assert spec is not None, f"no CDI spec at {path}"
    assert spec["error"] is None, spec["error"]
    assert same_driver(spec["driver_version"], loaded), f"{path} is for driver {spec['driver_version']}, not {loaded}"
    missing = missing_devices(spec, count)
    assert not missing, f"{path} lists no device {', '.join(missing)} for {count} GPU(s) (it has {spec['devices']})"


def test_no_broken_or_stale_cdi_spec(node: Node) -> None:
    """Every spec parses, and no NVIDIA spec (nvidia-ctk's or the device plugin's) is for another driver."""
    gpu_count(node)
    loaded = _loaded_driver(node)
    specs = read_fact(node, CdiSpecs)
    broken = [spec["error"] for spec in specs if spec["error"]]
    assert not broken, "; ".join(broken)
    nvidia = [spec for spec in specs if spec["kind"] == "nvidia.com/gpu" or spec["device_plugin"]]
    stale = [
        f"{spec['path']} (driver {spec['driver_version']})"
        for spec in nvidia
        if not same_driver(spec["driver_version"], loaded)
    ]
    assert not stale, f"CDI specs not for the loaded driver {loaded}: {', '.join(stale)}"
