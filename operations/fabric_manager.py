"""Install and hold NVIDIA Fabric Manager at the driver's version on NVSwitch systems."""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, StringCommand, operation

from pyinfra_gpunode.driver_versions import upstream_version
from pyinfra_gpunode.facts.driver import NvidiaHostState
from pyinfra_gpunode.facts.package_index import NvidiaAptVersions
from pyinfra_gpunode.operations import _packages
from pyinfra_gpunode.operations._atomic import fail as _fail
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact


@operation()
@locked_before_changes
def fabric_manager(version: str | None = None, preinstalled: bool = False) -> Generator[Any, Any, None]:
    """
    Install Fabric Manager at exactly the loaded driver's version, held, on NVSwitch systems only.

    + version: driver version Fabric Manager must match; default the loaded module's version
    + preinstalled: the driver was installed outside the package manager (``driver`` with
      ``source="preinstalled"``), which brings its own Fabric Manager: only check that
      ``nvidia-fabricmanager.service`` is active, never install or hold a package

    Ubuntu: ``nvidia-fabricmanager-<branch>``; Debian does not package Fabric Manager, so an
    NVSwitch system on Debian fails with a message. PCIe-only systems are skipped (Fabric
    Manager refuses to start there).

    **Example:**

    .. code:: python

        fabric_manager.fabric_manager(name="Fabric Manager on NVSwitch systems")
    """
    if version is not None and not re.match(r"^\d+\.\d+(\.\d+)?$", version):
        raise OperationValueError(f"version must be a driver version like 580.126.20, got {version!r}")
    facts = node_fact(NvidiaHostState)
    if not facts["pci"]["nvswitch"]:
        host.noop("no NVSwitch on this node; Fabric Manager not needed")
        return
    target = version or facts["driver"]["kernel_module_version"]
    if not target:
        yield _fail("Fabric Manager: no NVIDIA driver is loaded and no version was given")
        return
    fm = facts["fabric_manager"]
    if preinstalled:
        if fm["active"] == "active":
            host.noop(f"Fabric Manager is active beside the preinstalled driver {target}")
        else:
            yield _fail(
                f"Fabric Manager: nvidia-fabricmanager.service is {fm['active'] or 'missing'} on this NVSwitch node; "
                f"install and start the Fabric Manager of the preinstalled driver {target} as the driver was installed"
            )
        return
    if facts["distro"] != "ubuntu":
        yield _fail(f"Fabric Manager: no package for distribution {facts['distro']} (supported: ubuntu)")
        return
    name = f"nvidia-fabricmanager-{target.split('.', 1)[0]}"
    current = fm["packages"].get(name)
    if current and upstream_version(current) == target and name in fm["held"] and fm["enabled"] == "enabled":
        host.noop(f"Fabric Manager {target} is installed, held and enabled")
        return
    if not current or upstream_version(current) != target:
        available = host.get_fact(NvidiaAptVersions, packages=[name])
        match = [v for v in available.get(name, []) if upstream_version(v) == target]
        if not match:
            yield _fail(f"Fabric Manager: the package index offers no {name} at version {target}")
            return
        yield _packages.install({name: match[0]})
    yield _packages.hold([name])
    yield StringCommand("systemctl", "enable", "--now", "nvidia-fabricmanager.service")
