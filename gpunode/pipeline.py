"""The deploys' building blocks as pyinfra ``@deploy`` functions, driven by validated host data.

From the CLI the deploy files call them; from Python::

    add_deploy(state, gpu_node_prepared)
    run_ops(state)
"""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host, state
from pyinfra.api import State, deploy
from pyinfra.facts.server import LinuxDistribution

from pyinfra_gpunode.facts.nvidia import NvidiaDriver, NvidiaGpus
from pyinfra_gpunode.hostdata import HostDataError, validate
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import cdi, containerd, distribution, kernel, nvidia, rollout, unattended_upgrades
from pyinfra_gpunode.rollout import NodeReport, rollout_order


def settings() -> dict[str, Any]:
    """This host's validated host data, with the rollout order checked against the inventory."""
    values = validate(host.data.dict())
    values["rollout_order"] = _rollout_order(state._get_module())  # type: ignore[attr-defined]
    return values


# Per run (State): the rollout order, worked out once from the whole inventory, not once per host.
_ROLLOUT_ORDERS: weakref.WeakKeyDictionary[State, list[str]] = weakref.WeakKeyDictionary()


def _rollout_order(run: State) -> list[str]:
    if run not in _ROLLOUT_ORDERS:
        inventory = list(run.inventory)
        orders = {tuple(other.data.get("gpunode_rollout_order", [])) for other in inventory}
        if len(orders) > 1:
            raise HostDataError("host-data key 'gpunode_rollout_order' differs between hosts; set it once for all")
        _ROLLOUT_ORDERS[run] = rollout_order([other.name for other in inventory], list(orders.pop()) if orders else [])
    return _ROLLOUT_ORDERS[run]


def _runtime(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "binary": values["gpunode_nvidia_runtime_binary"],
        "systemd_cgroup": values["gpunode_nvidia_systemd_cgroup"],
        "default_runtime": values["gpunode_nvidia_default_runtime"],
        "cdi_spec_dirs": values["gpunode_cdi_spec_dirs"],
        "dropin_dir": values["gpunode_containerd_dropin_dir"],
        "binary_required": values["gpunode_runtime_binary_required"],
    }


@deploy("Register the nvidia runtime with containerd")
def nvidia_runtime_registered(values: dict[str, Any] | None = None) -> None:
    """
    Register the nvidia runtime with containerd. With ``gpunode_containerd_restart: rolling``
    each node's files are written at its turn and containerd restarted and verified one node at
    a time, in rollout order, halting at the first failure; with ``none`` files are only written.
    ``values``: this host's ``settings()`` when the caller has them already.
    """
    values = values or settings()
    if values["gpunode_containerd_restart"] == "rolling":
        rollout.nvidia_runtime_rolled_out(
            name="containerd: nvidia runtime rolled out one node at a time",
            order=values["rollout_order"],
            runtime=_runtime(values),
            timeout=values["gpunode_restart_timeout"],
            _serial=True,
        )
    else:
        containerd.nvidia_runtime(name="containerd: nvidia runtime registered", **_runtime(values))


def _report() -> NodeReport:
    return rollout.REPORTS.setdefault(state._get_module(), {}).setdefault(host.name, NodeReport())  # type: ignore[attr-defined]


def _driver_ready() -> bool:
    """``_if`` of the GPU steps after the driver: false (and reported) while a reboot is pending."""
    report = _report()
    if report.driver_ready is None:
        driver = host.get_fact(NvidiaDriver)
        report.driver_ready = bool(driver["loaded"] and not driver["mismatch"])
        if not report.driver_ready:
            loaded = driver["kernel_module_version"] or "no module"
            report.pending.append(f"reboot: driver {driver['userspace_version'] or '?'} installed, {loaded} loaded")
            report.skipped.append("Fabric Manager, toolkit, CDI: reboot pending")
            logger.warning("%sreboot pending: Fabric Manager, toolkit and CDI steps skipped", host.print_prefix)
    return report.driver_ready


@deploy("Prepare a Kubernetes GPU node")
def gpu_node_prepared() -> None:
    """
    Prepare the node in dependency order: kernel held, unattended-upgrades and needrestart,
    nouveau, then on nodes with an NVIDIA GPU the driver and, once it is loaded, Fabric
    Manager, the container toolkit and the CDI spec; last the containerd runtime, rolled out
    one node at a time, and a per-node summary.
    """
    if distribution.refusal(host.get_fact(LinuxDistribution)["release_meta"]):
        distribution.supported(name="distribution: supported")  # fails the node before any change
        return
    values = settings()
    kernel.held(name="kernel: held", present=values["gpunode_kernel_hold"])
    unattended_upgrades.configured(
        name="unattended-upgrades and needrestart: configured",
        mode=values["gpunode_unattended_upgrades"],
        blacklist=values["gpunode_unattended_blacklist"],
        needrestart_keep=values["gpunode_needrestart_keep"],
    )
    kernel.nouveau_blacklisted(name="nouveau: blacklisted")
    if host.get_fact(NvidiaGpus)["gpus"]:
        nvidia.driver(
            name="NVIDIA driver: installed and held",
            branch=values["gpunode_driver_branch"],
            version=values["gpunode_driver_version"],
            flavor=values["gpunode_driver_flavor"],
            allow_dkms=values["gpunode_allow_dkms"],
            mok_enrolled=values["gpunode_mok_enrolled"],
            reboot=values["gpunode_reboot"],
        )
        nvidia.fabric_manager(name="Fabric Manager: matches the driver", _if=_driver_ready)
        nvidia.container_toolkit(
            name="NVIDIA Container Toolkit: installed and held",
            source=values["gpunode_toolkit_source"],
            version=values["gpunode_toolkit_version"],
            deb_dir=values["gpunode_toolkit_deb_dir"],
            _if=_driver_ready,
        )
        cdi.spec(
            name="CDI spec: current for the loaded driver", path=values["gpunode_cdi_spec_path"], _if=_driver_ready
        )
    else:
        _report().skipped.append("driver, Fabric Manager, toolkit, CDI: no NVIDIA GPU")
        logger.info("%sno NVIDIA GPU: driver, Fabric Manager, toolkit and CDI steps skipped", host.print_prefix)
    nvidia_runtime_registered(values=values)
