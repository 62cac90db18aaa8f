"""The GPU part of gpu_node_prepared on two @fake hosts fed real fact outputs: a pending reboot
stops the later GPU steps on its node and is reported; a loaded driver lets them run."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.facts.cdi import CdiSpecs
from pyinfra_gpunode.facts.containerd import ContainerdNodeState
from pyinfra_gpunode.facts.driver import NvidiaDriver, NvidiaHostState
from pyinfra_gpunode.facts.gpus import NvidiaGpus
from pyinfra_gpunode.facts.kernel import PREP_PART, HostPrepState, KernelState, NouveauBlacklist
from pyinfra_gpunode.facts.node import KIND_PART, NodeKind, NodeSnapshot
from pyinfra_gpunode.facts.node import PART as NODE_PART
from pyinfra_gpunode.facts.readiness import PART as READINESS_PART
from pyinfra_gpunode.facts.toolkit import NvidiaContainerToolkit
from pyinfra_gpunode.facts.unattended_upgrades import UnattendedUpgradesState
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.operations.kernel import NOUVEAU_CONF
from pyinfra_gpunode.pipelines.gpu_node import gpu_node_prepared
from tests.integration.summary import summary_rows

TESTS = Path(__file__).resolve().parents[1]
RUNTIME = "/usr/bin/nvidia-container-runtime"


def fixture_output(fact: str, name: str) -> list[str]:
    return list(json.loads((TESTS / "facts" / fact / f"{name}.json").read_text())["output"])


# Debian 13, Secure Boot off, driver 550.163.01 with DKMS installed and held, one H100.
HOST_STATE = [
    "@@os",
    "debian",
    "13",
    "@@arch",
    "amd64",
    "@@kernel",
    "6.12.117+deb13-amd64",
    "@@secureboot",
    "efivar 0",
    "@@pci",
    "0000:41:00.0 0x030200 0x2331",
    "@@nvswitch",
    "@@module",
    "@@proc",
    "@@library",
    "@@smi",
    "@@fm_packages",
    "@@fm_unit",
    "active=inactive",
    "enabled=not-found",
    "@@packages",
    "hi \tnvidia-driver\t550.163.01-2",
    "hi \tfirmware-nvidia-gsp\t550.163.01-2",
    "hi \tlibcuda1\t550.163.01-2",
    "hi \tnvidia-smi\t550.163.01-2",
    "hi \tnvidia-kernel-dkms\t550.163.01-2",
    "hi \tnvidia-persistenced\t550.163.01-1",
    "hi \tlinux-headers-6.12.117+deb13-amd64\t6.12.117-1",
    "@@kmod",
    "/lib/modules/6.12.117+deb13-amd64/updates/dkms/nvidia-current.ko.xz",
    "@@kmod_version",
    "550.163.01",
    "@@kmod_vermagic",
    "6.12.117+deb13-amd64 SMP preempt mod_unload modversions ",
    "@@kmod_signer",
]
LOADED = fixture_output("driver.NvidiaDriver", "debian_renamed_modules")  # 550.163.01 loaded
NOT_LOADED = fixture_output("driver.NvidiaDriver", "userspace_only_not_loaded")  # installed, reboot pending


def fake_host(name: str, driver: list[str]) -> tuple[str, dict[str, Any]]:
    host_state = HOST_STATE[:12] + driver + HOST_STATE[16:]  # the driver sections of NvidiaHostState
    responses: dict[Any, Any] = {  # longest commands first: a fact's command may contain another's
        re.compile(r">&2 && exit 1$"): {"success": False},  # operations' fail(): a failing command
        HostPrepState().command(NOUVEAU_CONF): [
            f"{PREP_PART}kernel",
            *fixture_output("kernel.KernelState", "debian_trixie_unheld"),
            f"{PREP_PART}unattended",
            *fixture_output("unattended_upgrades.UnattendedUpgradesState", "debian_trixie_default"),
            f"{PREP_PART}nouveau",
            *fixture_output("kernel.NouveauBlacklist", "absent"),
        ],
        # each step's own read once an earlier step changed the node
        KernelState().command(): fixture_output("kernel.KernelState", "debian_trixie_unheld"),
        UnattendedUpgradesState().command(): fixture_output(
            "unattended_upgrades.UnattendedUpgradesState", "debian_trixie_default"
        ),
        NouveauBlacklist().command(NOUVEAU_CONF): fixture_output("kernel.NouveauBlacklist", "absent"),
        NvidiaHostState().command(): host_state,
        ContainerdNodeState().command(RUNTIME): (TESTS / "samples/containerd-node-state-1.7-converged.txt")
        .read_text()
        .splitlines(),
        NvidiaContainerToolkit().command(): fixture_output("toolkit.NvidiaContainerToolkit", "installed_1_17"),
        CdiSpecs().command(): [],
        NvidiaDriver().command(): driver,
        NodeKind().command(): [
            f"{KIND_PART}distribution",
            "/etc/os-release",
            "ID=debian",
            'VERSION_ID="13"',
            "---",
            f"{KIND_PART}gpus",
            "@@pci",
            "0000:41:00.0 0x030200 0x2331",
            "@@nvswitch",
        ],
        NvidiaGpus().command(): ["@@pci", "0000:41:00.0 0x030200 0x2331", "@@nvswitch"],
    }
    data = {
        "fake_responses": {re.compile(r">&2 && exit 1$"): {"success": False}, **snapshot(responses), **responses},
        "fake_delay": 0,
        "fake_delay_jitter": 0,
        "gpunode_driver_version": "550.163.01",
        "gpunode_driver_flavor": "default",
        "gpunode_allow_dkms": True,
        "gpunode_toolkit_source": "installed",
    }
    return f"@fake/{name}", data


def snapshot(responses: dict[Any, Any]) -> dict[str, list[str]]:
    """The node snapshot's answer, made of the answers to the facts it holds."""
    readiness = {
        "host": responses[NvidiaHostState().command()],
        "toolkit": responses[NvidiaContainerToolkit().command()],
        "cdi": responses[CdiSpecs().command()],
        "containerd": responses[ContainerdNodeState().command(RUNTIME)],
    }
    lines = [f"{NODE_PART}kind", *responses[NodeKind().command()], f"{NODE_PART}prep"]
    lines += responses[HostPrepState().command(NOUVEAU_CONF)] + [f"{NODE_PART}readiness"]
    lines += [line for part, text in readiness.items() for line in (f"{READINESS_PART}{part}", *text)]
    return {NodeSnapshot().command(RUNTIME, NOUVEAU_CONF): lines}


def h200_host(name: str) -> tuple[str, dict[str, Any]]:
    """The H200 sample: driver 580.159.04 installed outside apt and loaded; no GPU host data at all."""
    target, data = fake_host(name, fixture_output("driver.NvidiaDriver", "h200_open_580_preinstalled"))
    responses = data["fake_responses"]
    responses[NvidiaHostState().command()] = fixture_output("driver.NvidiaHostState", "h200_ubuntu_preinstalled")
    responses[NvidiaGpus().command()] = fixture_output("gpus.NvidiaGpus", "h200_pcie")
    responses[NodeKind().command()] = [*responses[NodeKind().command()][:6], *responses[NvidiaGpus().command()]]
    responses.update(snapshot(responses))
    return target, {key: value for key, value in data.items() if not key.startswith("gpunode_")}


@pytest.fixture
def run(caplog: pytest.LogCaptureFixture) -> State:
    caplog.set_level(logging.INFO, logger="pyinfra.gpunode")
    inventory = Inventory(([fake_host("gpu1", NOT_LOADED), fake_host("gpu2", LOADED), h200_host("h200")], {}))
    state = State(inventory=inventory, config=Config())
    connect_all(state)
    try:
        add_deploy(state, gpu_node_prepared)
        run_ops(state)
    finally:
        disconnect_all(state)
    return state


def commands(state: State, name: str) -> str:
    return "\n".join(state.inventory.get_host(f"@fake/{name}").connector.executed_commands)  # type: ignore[attr-defined]


def test_pending_reboot_stops_later_gpu_steps_and_is_reported(run: State, caplog: pytest.LogCaptureFixture) -> None:
    assert not run.failed_hosts, [host.name for host in run.failed_hosts]
    assert "nvidia-ctk cdi generate" not in commands(run, "gpu1")
    assert "nvidia-ctk cdi generate" in commands(run, "gpu2")

    reports = {name.removeprefix("@fake/"): report for name, report in run_state(run).reports.items()}
    assert reports["gpu1"].pending == ["reboot: driver 550.163.01 installed, no module loaded"]
    assert reports["gpu1"].skipped == ["Fabric Manager, toolkit, CDI: reboot pending"]
    assert reports["gpu2"].pending == [] and reports["gpu2"].skipped == []

    summary = next(r.getMessage() for r in caplog.get_records("setup") if "Summary" in r.getMessage())
    rows = summary_rows(summary)
    assert "reboot: driver 550.163.01 installed" in rows["@fake/gpu1"]
    assert "CDI spec: current for the loaded driver" in rows["@fake/gpu2"]


def test_preinstalled_driver_without_host_data_reaches_toolkit_and_cdi(
    run: State, caplog: pytest.LogCaptureFixture
) -> None:
    assert "@fake/h200" not in [host.name for host in run.failed_hosts]
    executed = commands(run, "h200")
    assert "nvidia-ctk cdi generate" in executed
    assert not re.search(r"apt-get install [^\n]*nvidia|apt-mark hold [^\n]*nvidia", executed), executed
    report = run_state(run).reports["@fake/h200"]
    assert report.skipped == ["driver 580.159.04 (open) preinstalled"] and report.pending == []
    summary = next(r.getMessage() for r in caplog.get_records("setup") if "Summary" in r.getMessage())
    row = summary_rows(summary)["@fake/h200"]
    assert "driver 580.159.04 (open) preinstalled" in row


def planned_turns(hosts: list[tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """Each node's disruptive changes planned for its rollout turn, as gpu_node_prepared plans them."""
    state = State(inventory=Inventory((hosts, {})), config=Config())
    connect_all(state)
    try:
        add_deploy(state, gpu_node_prepared)
    finally:
        disconnect_all(state)
    return {name: changes for name, (changes, _, _) in run_state(state).driver_turns.items()}


def test_a_toolkit_upgrade_is_made_in_the_nodes_turn() -> None:
    """The toolkit's postinst reloads systemd and starts the CDI refresh: its upgrade waits for the turn,
    on a node whose driver does not change; a node whose toolkit is kept takes no turn."""
    upgraded, data = fake_host("gpu2", LOADED)
    data = {**data, "gpunode_toolkit_source": "repository", "gpunode_toolkit_version": "1.18.0-1"}
    assert planned_turns([(upgraded, data)]) == {"@fake/gpu2": ["toolkit: install 1.18.0-1 (installed: 1.17.0-1)"]}
    assert planned_turns([fake_host("gpu3", LOADED)]) == {}


def steps(target: str, data: dict[str, Any]) -> list[str]:
    """The steps gpu_node_prepared adds on this one node, in order (one node per run: in API mode pyinfra
    tells operations apart by their count on each host)."""
    state = prepared(target, data)
    return [sorted(state.op_meta[op].names)[0].rsplit(" | ", 1)[-1] for op in state.get_op_order()]


def prepared(target: str, data: dict[str, Any]) -> State:
    """A run of one node whose gpu_node_prepared steps are added (prepared, not run)."""
    state = State(inventory=Inventory(([(target, data)], {})), config=Config())
    connect_all(state)
    try:
        add_deploy(state, gpu_node_prepared)
    finally:
        disconnect_all(state)
    return state


def test_a_turns_packages_are_downloaded_before_the_rollout_on_its_node_only() -> None:
    """A node whose toolkit upgrade waits for its turn gets the download steps in the parallel part, ahead of
    the rollout; a node with nothing disruptive to do gets none."""
    upgraded, data = fake_host("gpu2", LOADED)
    turn = steps(upgraded, {**data, "gpunode_toolkit_source": "repository", "gpunode_toolkit_version": "1.18.0-1"})
    downloads = ["NVIDIA driver: packages downloaded before the turns",
                 "NVIDIA Container Toolkit: packages downloaded before the turns"]  # fmt: skip
    assert [step for step in turn if step in downloads] == downloads, turn
    assert turn.index(downloads[-1]) < turn.index("containerd: nvidia runtime rolled out in turns")
    assert "NVIDIA Container Toolkit: installed and held" not in turn  # in its turn, not here
    kept = steps(*fake_host("gpu3", LOADED))
    assert "NVIDIA Container Toolkit: installed and held" in kept and not set(downloads) & set(kept), kept


def test_a_module_missing_for_the_next_kernel_is_planned_and_pending(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pyinfra.gpunode")
    target, data = fake_host("gpu3", LOADED)
    responses = data["fake_responses"]
    following = "6.12.120+deb13-amd64"  # /vmlinuz already names it; DKMS built for the running kernel only
    boot = ["@@boot_release", following, "@@boot_kmod", "@@boot_kmod_version"]
    responses[NvidiaHostState().command()] = [*responses[NvidiaHostState().command()], *boot]
    responses.update(snapshot(responses))
    state = prepared(target, data)

    warning = (
        f"the nvidia module is built for the running kernel 6.12.117+deb13-amd64 but not for {following}, the "
        "kernel this node boots next: after a reboot no nvidia module loads"
    )
    assert any(f"plan: {warning}" in record.getMessage() for record in caplog.records), caplog.text
    (pending,) = run_state(state).reports[target].pending
    assert pending.startswith(f"next boot: {warning}")
