"""Host preparation of a ready node: the kernel is held, nothing upgrades or restarts behind our back."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.facts.kernel import KernelState
from pyinfra_gpunode.facts.unattended_upgrades import UnattendedUpgradesState
from pyinfra_gpunode.hostdata import settings as settings_of
from pyinfra_gpunode.kernel_plan import kernel_packages

from .facts import read_fact
from .inventory import Node


def test_running_kernel_held(node: Node) -> None:
    if not settings_of(node.data).updates.kernel_hold:
        pytest.skip("gpunode_kernel_hold is off for this host")
    kernel = read_fact(node, KernelState)
    expected = set(kernel_packages(kernel["running"], kernel["packages"]))
    if not expected:
        pytest.skip(f"{node.name}: no kernel packages installed (a container on its machine's kernel)")
    assert expected <= set(kernel["held"]), f"not held: {sorted(expected - set(kernel['held']))}"


def test_unattended_upgrades_off(node: Node) -> None:
    state = read_fact(node, UnattendedUpgradesState)
    updates = settings_of(node.data).updates
    if not state["unattended_upgrades_installed"]:
        pytest.skip(f"{node.name}: unattended-upgrades is not installed; nothing to check")
    if updates.unattended == "disabled":
        assert not state["unattended_enabled"], f"APT::Periodic still upgrades: {state['periodic']}"
    else:
        missing = set(updates.blacklist) - set(state["blacklist"])
        assert not missing, f"not blacklisted for unattended-upgrades: {sorted(missing)}"


def test_needrestart_never_restarts_containerd(node: Node) -> None:
    state = read_fact(node, UnattendedUpgradesState)
    if not state["needrestart_installed"]:
        pytest.skip(f"{node.name}: needrestart is not installed; nothing to check")
    kept = set(settings_of(node.data).updates.needrestart_keep)
    restartable = kept - set(state["needrestart"]["excluded"])
    assert not restartable, f"needrestart may restart {sorted(restartable)}"
