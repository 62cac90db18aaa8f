"""The verification suite's checks judging a right node and a wrong one.

Each node answers the facts' own commands with output captured from real nodes (the fact fixtures
under ``tests/facts``), and each check runs as the suite runs it: it reads the node through
``read_fact`` (the fact's command, then its ``process``), then passes, fails or skips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import FactBase

from pyinfra_gpunode.facts.cdi import CdiRefreshUnits, CdiSpecs
from pyinfra_gpunode.facts.containerd import (
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdService,
)
from pyinfra_gpunode.facts.driver import NvidiaDriver
from pyinfra_gpunode.facts.fabric_manager import NvidiaFabricManager
from pyinfra_gpunode.facts.gpus import NvidiaGpus
from pyinfra_gpunode.facts.nvml import NvmlInfo
from pyinfra_gpunode.facts.operator import GpuOperatorState
from pyinfra_gpunode.facts.unattended_upgrades import UnattendedUpgradesState
from pyinfra_gpunode.sections import split_sections
from pyinfra_gpunode.verify import test_containerd as containerd_checks
from pyinfra_gpunode.verify import test_gpu as gpu_checks
from pyinfra_gpunode.verify import test_host as host_checks
from pyinfra_gpunode.verify.inventory import Node

FACTS = Path(__file__).resolve().parents[1] / "facts"
RUNTIME = "/usr/bin/nvidia-container-runtime"


def captured(fact: str, name: str) -> list[str]:
    return list(json.loads((FACTS / fact / f"{name}.json").read_text())["output"])


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str = ""


class CapturedNode:
    """A node (testinfra's ``host.run``) answering each fact's command with its captured output;
    ``executables``: paths ``test -x`` finds. Any other command is an error of the test."""

    def __init__(self, outputs: dict[str, list[str]], executables: tuple[str, ...] = ()) -> None:
        self.outputs = outputs
        self.executables = executables

    def run(self, command: str) -> Result:
        if command in self.outputs:
            return Result(0, "".join(line + "\n" for line in self.outputs[command]))
        if command.startswith("command -v "):
            return Result(0, "/usr/bin/" + command.split()[-1] + "\n")
        if command.startswith("test -x "):
            return Result(0 if command.split(" ", 2)[2] in self.executables else 1, "")
        raise AssertionError(f"the check ran a command no fact of this node answers: {command}")


def node(facts: dict[tuple[type[FactBase[Any]], str], list[str]], executables: tuple[str, ...] = ()) -> Node:
    """``facts``: (fact class, its command's one argument or "") -> the output of its command."""
    outputs = {}
    for (fact, argument), output in facts.items():
        command = fact().command(**({"config_path": argument} if argument else {}))
        outputs[command] = output
    return Node("node1", CapturedNode(outputs, executables), {})


def outcome(check: Any, checked: Node) -> str:
    try:
        check(checked)
    except pytest.skip.Exception as skipped:
        return f"skipped: {skipped.msg}"
    except AssertionError as failed:
        return f"failed: {str(failed).splitlines()[0]}"
    return "passed"


# --- GPU checks: an H200 node with driver 580.159.04 (open module, preinstalled) -------------------------

H200 = {
    (NvidiaGpus, ""): captured("gpus.NvidiaGpus", "h200_pcie"),
    (NvidiaDriver, ""): captured("driver.NvidiaDriver", "h200_open_580_preinstalled"),
    (NvmlInfo, ""): captured("nvml.NvmlInfo", "h200_open_580_preinstalled"),
    (CdiSpecs, ""): captured("cdi.CdiSpecs", "ctk_sorted_yaml_h200"),
    (NvidiaFabricManager, ""): captured("fabric_manager.NvidiaFabricManager", "not_installed"),
    (CdiRefreshUnits, ""): captured("cdi.CdiRefreshUnits", "toolkit_1_17_none"),
    (GpuOperatorState, ""): captured("operator.GpuOperatorState", "no_operator"),
}
# The same with a second GPU on the PCI bus that NVML does not see (and the spec does not list).
TWO_GPUS = captured("gpus.NvidiaGpus", "h200_pcie")
TWO_GPUS.insert(2, TWO_GPUS[1].replace("0000:00:06.0", "0000:00:07.0"))
DGX = captured("gpus.NvidiaGpus", "dgx_a100_nvswitch")


def gpu_node(executables: tuple[str, ...] = (RUNTIME,), **changed: list[str]) -> Node:
    facts = dict(H200)
    for fact in (NvidiaGpus, NvidiaDriver, NvmlInfo, CdiSpecs, NvidiaFabricManager, CdiRefreshUnits):
        if fact.__name__ in changed:
            facts[(fact, "")] = changed[fact.__name__]
    return node(facts, executables)


GPU_CHECKS = {
    "test_driver_loaded_and_matches_userspace": (
        gpu_node(),
        gpu_node(NvidiaDriver=captured("driver.NvidiaDriver", "mismatch")),
        "failed: kernel module 510.73.05 but userspace library 515.48.07: a reboot is pending",
    ),
    "test_nvml_driver_matches_module": (
        gpu_node(),
        gpu_node(NvmlInfo=captured("nvml.NvmlInfo", "working")),  # NVML 550.54.15
        "failed: NVML reports driver 550.54.15, module 580.159.04 is loaded",
    ),
    "test_nvml_sees_every_pci_gpu": (
        gpu_node(),
        gpu_node(NvidiaGpus=TWO_GPUS),
        "failed: NVML sees 1 GPU(s), the PCI bus has 2",
    ),
    "test_fabric_manager_active_on_nvswitch_nodes": (
        gpu_node(NvidiaGpus=DGX, NvidiaFabricManager=captured("fabric_manager.NvidiaFabricManager", "cuda_repo_held")),
        gpu_node(NvidiaGpus=DGX),
        "failed: nvidia-fabricmanager.service is inactive",
    ),
    "test_toolkit_runtime_binary_present": (
        gpu_node(),
        gpu_node(executables=()),
        f"failed: {RUNTIME} is missing or not executable",
    ),
    "test_cdi_spec_current_and_lists_every_gpu": (
        gpu_node(),
        gpu_node(CdiSpecs=captured("cdi.CdiSpecs", "none")),
        "failed: no CDI spec at /etc/cdi/nvidia.yaml",
    ),
    "test_no_broken_or_stale_cdi_spec": (
        gpu_node(),
        gpu_node(CdiSpecs=[line.replace("580.159.04", "570.195.03") for line in captured("cdi.CdiSpecs", "ctk_json")]),
        "failed: CDI specs not for the loaded driver 580.159.04: /etc/cdi/nvidia.json (driver 570.195.03)",
    ),
}


def test_every_gpu_check_is_shown_right_and_wrong() -> None:
    assert sorted(GPU_CHECKS) == sorted(name for name in vars(gpu_checks) if name.startswith("test_"))


@pytest.mark.parametrize("name", sorted(GPU_CHECKS))
def test_gpu_check_passes_on_a_right_node(name: str) -> None:
    assert outcome(getattr(gpu_checks, name), GPU_CHECKS[name][0]) == "passed"


@pytest.mark.parametrize("name", sorted(GPU_CHECKS))
def test_gpu_check_fails_on_a_wrong_node(name: str) -> None:
    assert outcome(getattr(gpu_checks, name), GPU_CHECKS[name][1]).startswith(GPU_CHECKS[name][2])


@pytest.mark.parametrize("name", sorted(GPU_CHECKS))
def test_gpu_check_skips_a_node_without_gpu(name: str) -> None:
    assert outcome(getattr(gpu_checks, name), gpu_node(NvidiaGpus=captured("gpus.NvidiaGpus", "no_gpu"))) == (
        "skipped: node1: no NVIDIA GPU on the PCI bus"
    )


def test_where_the_refresh_service_owns_the_spec_its_spec_is_checked() -> None:
    """gpunode_cdi_owner auto: with toolkit 1.18's refresh units the spec is /var/run/cdi/nvidia.yaml."""
    at_runtime = [
        line.replace("/etc/cdi/", "/var/run/cdi/") for line in captured("cdi.CdiSpecs", "ctk_sorted_yaml_h200")
    ]
    units = captured("cdi.CdiRefreshUnits", "toolkit_1_18")
    check = gpu_checks.test_cdi_spec_current_and_lists_every_gpu
    assert outcome(check, gpu_node(CdiSpecs=at_runtime, CdiRefreshUnits=units)) == "passed"
    assert outcome(check, gpu_node(CdiRefreshUnits=units)) == "failed: no CDI spec at /var/run/cdi/nvidia.yaml"


def test_nvml_checks_skip_without_pynvml_on_the_node() -> None:
    checked = gpu_node(NvmlInfo=[])
    for check in (gpu_checks.test_nvml_driver_matches_module, gpu_checks.test_nvml_sees_every_pci_gpu):
        assert outcome(check, checked).startswith("skipped: node1: python3 with pynvml")


# --- containerd's running daemon, as the rollout judges it ---------------------------------------------

STATE = split_sections(captured("containerd.ContainerdNodeState", "sid_2_1"))  # containerd 2.1, runc default


def containerd_node(cri: str, service: str = "current") -> Node:
    return node({
        (ContainerdConfigFiles, ""): STATE["files"],
        (ContainerdConfigDump, "/etc/containerd/config.toml"): STATE["dump"],
        (ContainerdService, ""): captured("containerd.ContainerdService", service),
        (ContainerdCriLoaded, ""): captured("containerd.ContainerdCriLoaded", cri),
    })  # fmt: skip


@pytest.mark.parametrize(
    ("cri", "service", "expected"),
    [
        ("loaded_2_1", "current", "passed"),  # the start line: nvidia and runc loaded, runc the default
        ("warn_level_ctr_ok_2_1", "current", "passed"),  # logging above info: ctr says the CRI plugin is ok
        ("warn_level_ctr_error_1_7", "current", "failed: the running containerd: the CRI plugin did not load: ctr"),
        ("failed_no_runc_1_7", "current", "failed: the running containerd: the CRI plugin did not load"),
        ("loaded_2_1", "stopped", "failed: the running containerd: the unit is inactive"),
    ],
)
def test_running_daemon_judged_as_the_rollout_judges_it(cri: str, service: str, expected: str) -> None:
    checked = containerd_node(cri, service)
    assert outcome(containerd_checks.test_running_daemon_loaded_nvidia_runtime, checked).startswith(expected)


def test_running_daemon_without_the_nvidia_runtime_fails() -> None:
    only_runc = [line.replace("nvidia", "other") for line in captured("containerd.ContainerdCriLoaded", "loaded_2_1")]
    checked = node({
        (ContainerdConfigFiles, ""): STATE["files"],
        (ContainerdConfigDump, "/etc/containerd/config.toml"): STATE["dump"],
        (ContainerdService, ""): captured("containerd.ContainerdService", "current"),
        (ContainerdCriLoaded, ""): only_runc,
    })  # fmt: skip
    assert outcome(containerd_checks.test_running_daemon_loaded_nvidia_runtime, checked) == (
        "failed: the running containerd: the CRI plugin lacks runtimes nvidia (read from the CRI plugin's start "
        "line in the journal)"
    )


# --- host checks: each says what it checked, or skips naming what is absent ----------------------------

PREPARED = captured("unattended_upgrades.UnattendedUpgradesState", "sample_blacklist_disabled")
PREPARED.insert(1, "ii \tneedrestart\t3.11-1")  # needrestart installed, containerd and kubelet kept
DEFAULT = captured("unattended_upgrades.UnattendedUpgradesState", "debian_trixie_default")
ABSENT = [line for line in PREPARED if not line.startswith("ii ")]  # neither package installed


def host_node(output: list[str]) -> Node:
    return node({(UnattendedUpgradesState, ""): output})


@pytest.mark.parametrize(
    ("output", "unattended", "needrestart"),
    [
        (PREPARED, "passed", "passed"),
        (DEFAULT, "failed: APT::Periodic still upgrades", "failed: needrestart may restart ['containerd', 'kubelet']"),
        (
            ABSENT,
            "skipped: node1: unattended-upgrades is not installed; nothing to check",
            "skipped: node1: needrestart is not installed; nothing to check",
        ),
    ],
    ids=["prepared", "debian_default", "packages_absent"],
)
def test_host_checks_pass_fail_or_skip_naming_what_is_absent(
    output: list[str], unattended: str, needrestart: str
) -> None:
    checked = host_node(output)
    assert outcome(host_checks.test_unattended_upgrades_off, checked).startswith(unattended)
    assert outcome(host_checks.test_needrestart_never_restarts_containerd, checked).startswith(needrestart)
