"""Facts about NVIDIA Fabric Manager: its packages and its service."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.sections import DPKG_FORMAT, MARK, parse_dpkg_status, split_sections


class FabricManagerInfo(TypedDict):
    """``NvidiaFabricManager``'s value (also ``NvidiaHostState``'s ``fabric_manager``)."""

    packages: dict[str, str]
    held: list[str]
    version: str | None
    active: str | None
    enabled: str | None


# Print the Fabric Manager packages and its unit's state (shell/fabric-manager.sh).
FABRIC_MANAGER_COMMAND = shell.command(
    shell.script(Path(__file__).parent / "shell" / "fabric-manager.sh"), "gpunode-fabric-manager", MARK, DPKG_FORMAT
)


def parse_fabric_manager(sections: dict[str, list[str]]) -> FabricManagerInfo:
    packages = parse_dpkg_status(sections.get("fm_packages", []))
    unit = dict(line.partition("=")[::2] for line in sections.get("fm_unit", []) if "=" in line)
    versions = [info["version"] for name, info in packages.items() if name.startswith("nvidia-fabricmanager")]
    return {
        "packages": {name: info["version"] for name, info in sorted(packages.items())},
        "held": sorted(name for name, info in packages.items() if info["held"]),
        "version": str(versions[0]) if versions else None,
        "active": unit.get("active") or None,
        "enabled": unit.get("enabled") or None,
    }


class NvidiaFabricManager(FactBase[FabricManagerInfo]):
    """
    Returns the Fabric Manager packages installed (``nvidia-fabricmanager*``, ``libnvidia-nscq*``)
    with their versions and holds, and the state of ``nvidia-fabricmanager.service``.

    .. code:: python

        {
            "packages": {"nvidia-fabricmanager-580": "580.126.20-0ubuntu0.24.04.1"},
            "held": ["nvidia-fabricmanager-580"],
            "version": "580.126.20-0ubuntu0.24.04.1",
            "active": "active",
            "enabled": "enabled",
        }
    """

    @override
    def command(self) -> str:
        return FABRIC_MANAGER_COMMAND

    @staticmethod
    def default() -> FabricManagerInfo:
        return parse_fabric_manager({})

    @override
    def process(self, output: list[str]) -> FabricManagerInfo:
        return parse_fabric_manager(split_sections(output))
