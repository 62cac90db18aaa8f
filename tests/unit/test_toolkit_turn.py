"""A toolkit install or upgrade is a node disruption planned for the node's turn, and the CDI spec has
one owner: the planner agrees with ``toolkit.container_toolkit``'s golden fixtures, node by node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.facts.toolkit import TOOLKIT_PACKAGES
from pyinfra_gpunode.operations.toolkit import TOOLKIT_FINGERPRINT
from pyinfra_gpunode.toolkit_plan import (
    ToolkitRequestError,
    cdi_owner,
    check_toolkit,
    decide_toolkit,
    toolkit_install,
)

FIXTURES = Path(__file__).resolve().parents[1] / "operations" / "toolkit.container_toolkit"


def planned(case: dict[str, Any]) -> str | None:
    kwargs = case.get("kwargs", {})
    source = kwargs.get("source", "auto")
    version = check_toolkit(source, kwargs.get("version"), kwargs.get("deb_dir"))
    toolkit = case["facts"]["toolkit.NvidiaContainerToolkit"]
    found = decide_toolkit(toolkit, source, version, TOOLKIT_PACKAGES, TOOLKIT_FINGERPRINT)
    keyring = any(isinstance(command, str) and "gpg" in command for command in case["commands"])
    assert found.keyring_wrong <= keyring, "the decision pins a keyring the operation leaves"
    return found.install


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda path: path.stem)
def test_an_install_is_planned_exactly_where_the_operation_installs(path: Path) -> None:
    case = json.loads(path.read_text())
    try:
        target = planned(case)
    except ToolkitRequestError:
        assert "exception" in case
        return
    # An install from the repository starts with its update (the newest version is read then).
    installs = any("apt-get install" in str(command) or command == "apt-get update" for command in case["commands"])
    assert (target is not None) == installs, (path.stem, target, case.get("commands"))
    if installs and case.get("kwargs", {}).get("version"):
        assert target and target.startswith(case["kwargs"]["version"])


def test_an_upgrade_names_the_version_and_a_kept_set_plans_nothing() -> None:
    installed = dict.fromkeys(TOOLKIT_PACKAGES, "1.17.8-1")
    assert toolkit_install("repository", "1.18.0-1", installed, False, TOOLKIT_PACKAGES) == "1.18.0-1"
    assert toolkit_install("repository", None, installed, False, TOOLKIT_PACKAGES) is None  # kept once taken
    assert toolkit_install("repository", None, {}, False, TOOLKIT_PACKAGES) == ""  # the newest, read then
    mixed = {**installed, "libnvidia-container1": "1.18.0-1"}  # not one exact set: installed again as one
    assert toolkit_install("repository", "1.18.0-1", mixed, False, TOOLKIT_PACKAGES) == "1.18.0-1"


def test_the_cdi_spec_has_one_owner() -> None:
    assert cdi_owner("auto", True) == ("refresh", "")
    assert cdi_owner("auto", False) == ("project", "")
    assert cdi_owner("project", True) == ("project", "")
    assert cdi_owner("refresh", True) == ("refresh", "")
    _, error = cdi_owner("refresh", False)
    assert error == (
        "CDI spec owner is refresh, but nvidia-cdi-refresh.service is not installed "
        "(NVIDIA Container Toolkit 1.18 or later installs it)"
    )
    assert cdi_owner("toolkit", True)[1] == "CDI spec owner must be one of auto, project, refresh, got 'toolkit'"


def test_a_driver_containers_spec_is_never_left_to_the_refresh_unit() -> None:
    """The refresh unit looks for the driver on the host (nvidia-smi, nvidia.ko in modules.dep) and is skipped
    where the GPU Operator's driver container provides it: the project generates the spec from that root."""
    assert cdi_owner("auto", True, driver_container=True) == ("project", "")
    assert cdi_owner("project", True, driver_container=True) == ("project", "")
    owner, error = cdi_owner("refresh", True, driver_container=True)
    assert owner == "refresh" and error.startswith(
        "CDI spec owner is refresh, but the driver comes from the GPU Operator's driver container (/run/nvidia/driver)"
    )
    assert error.endswith("set gpunode_cdi_owner: auto or project")


def test_a_refresh_drop_in_cannot_list_units_of_its_own() -> None:
    """The drop-in's text is the node's: a line of it that looks like a unit is not one."""
    from pyinfra_gpunode.facts.cdi import CdiRefreshUnits, refresh_installed

    found = CdiRefreshUnits().process(["dropin", "unit /etc/systemd/system/nvidia-cdi-refresh.service"])
    assert found["units"] == [] and not refresh_installed(found)
