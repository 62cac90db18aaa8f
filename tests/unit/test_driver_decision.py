"""The driver step's one decision (``driver_plan.decide_driver``) agrees with ``driver.driver``'s golden
fixtures, node by node: the node fails exactly where the operation fails it with the decision's error, packages
are installed exactly where the decision plans them (and its turn's changes say so), and a node that keeps its
own driver installs nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.driver_plan import DriverRequest, DriverRequestError, check_request, decide_driver

FIXTURES = Path(__file__).resolve().parents[1] / "operations" / "driver.driver"
INSTALL = re.compile(r"apt-get .*install")


def cases() -> list[Path]:
    """The fixtures of a node with a GPU and arguments any node could take."""
    found = []
    for path in sorted(FIXTURES.glob("*.json")):
        case = json.loads(path.read_text())
        node = case["facts"].get("driver.NvidiaHostState")
        if "exception" not in case and node and node["pci"]["gpus"]:
            found.append(path)
    return found


def decided(case: dict[str, Any]) -> Any:
    kwargs = case["kwargs"]
    node = case["facts"]["driver.NvidiaHostState"]
    request = check_request(
        DriverRequest(
            kwargs.get("branch"),
            kwargs.get("version"),
            kwargs.get("flavor", "server"),
            kwargs.get("allow_dkms", False),
            kwargs.get("mok_enrolled", False),
        )
    )
    source, replace = kwargs.get("source", "auto"), kwargs.get("replace_preinstalled", False)
    found = decide_driver(node, source, request, replace, kwargs.get("downloaded"))
    if found.index:  # the operation reads the package index for these names, then decides again
        ((arguments, available),) = case["facts"]["package_index.NvidiaAptVersions"].items()
        assert arguments == f"packages={list(found.index)}", "the index read is not for the names planned"
        found = decide_driver(node, source, request, replace, kwargs.get("downloaded"), available)
    return found


@pytest.mark.parametrize("path", cases(), ids=lambda path: path.stem)
def test_the_decision_is_what_the_operation_does(path: Path) -> None:
    case = json.loads(path.read_text())
    found = decided(case)
    commands = [command for command in case["commands"] if isinstance(command, str)]
    failed = [command for command in commands if command.endswith(">&2 && exit 1")]
    installs = [command for command in commands if INSTALL.search(command)]
    if found.error:
        assert failed and failed[0].startswith(f"printf '%s\\n' '{found.error[:40]}"), (found.error, commands)
    assert bool(installs) == bool(found.to_install and not found.error), (found, commands)
    for name, version in found.to_install.items():
        assert f"{name}={version}" in installs[0] if version else name in installs[0]
    reboot = case["kwargs"].get("reboot", False)
    assert any(change.startswith("driver: install ") for change in found.changes(reboot)) == bool(installs)
    if found.keeps_own_driver:
        assert found.plan is None and not installs


def test_every_fixture_of_a_gpu_node_is_checked() -> None:
    assert len(cases()) >= 25


def test_a_bad_request_is_refused_before_any_decision() -> None:
    with pytest.raises(DriverRequestError):
        check_request(DriverRequest(branch="999"))


def fixture_node(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{name}.json").read_text())["facts"]["driver.NvidiaHostState"])


def test_a_package_at_another_version_is_upgraded_and_the_turn_reboots_into_it() -> None:
    node = fixture_node("ubuntu_converged")
    pinned = {name: str(package["version"]) for name, package in node["packages"].items()}
    node["packages"] = {**node["packages"], "nvidia-utils-580-server": {"version": "580.95.05-0", "held": True}}
    node["driver"] = {**node["driver"], "kernel_module_version": "580.95.05"}
    request = check_request(DriverRequest(version="580.126.20"))
    found = decide_driver(node, "auto", request)
    assert found.index and found.changes(reboot=True) == []  # undecided until the index is read
    found = decide_driver(node, "auto", request, available={name: [version] for name, version in pinned.items()})
    assert found.to_install == {"nvidia-utils-580-server": pinned["nvidia-utils-580-server"]}
    assert found.changes(reboot=False) == [
        f"driver: install nvidia-utils-580-server={pinned['nvidia-utils-580-server']}"
    ]
    assert found.changes(reboot=True)[1] == "driver: reboot (580.95.05 loaded, 580.126.20 installed)"
    assert found.versions(reboot=True) == ("580.95.05", "580.126.20")


def test_an_own_driver_newer_in_userspace_than_loaded_reboots_only_when_asked() -> None:
    node = fixture_node("preinstalled_reboot_pending")
    found = decide_driver(node, "auto", check_request(DriverRequest()))
    assert found.keeps_own_driver and found.needs_reboot and found.changes(reboot=False) == []
    loaded, userspace = node["driver"]["kernel_module_version"], node["driver"]["userspace_version"]
    assert found.changes(reboot=True) == [f"driver: reboot ({loaded} loaded, {userspace} installed)"]
    assert found.versions(reboot=True) == (loaded, userspace) and found.versions(reboot=False) == ("", "")


def test_a_branch_change_rebooted_into_puts_the_replaced_driver_back_where_it_does_not_load() -> None:
    fixture = json.loads((FIXTURES / "debian_branch_change_replaces_the_driver.json").read_text())["facts"]
    node = dict(fixture["driver.NvidiaHostState"])
    available = next(iter(fixture["package_index.NvidiaAptVersions"].values()))
    request = check_request(DriverRequest(version="535.274.02", allow_dkms=True))
    found = decide_driver(node, "packages", request, available=available)
    assert found.replaces == "550.163.01" and found.previous["nvidia-driver"] == "550.163.01-2"
    assert found.changes(reboot=True)[1] == (
        "driver: reboot (550.163.01 loaded, 535.274.02 installed); driver 550.163.01 put back where it does not load"
    )
    assert found.versions(reboot=True) == ("550.163.01", "535.274.02")
