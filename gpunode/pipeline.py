"""The deploys' building blocks as pyinfra ``@deploy`` functions, driven by validated host data."""

from __future__ import annotations

import logging
from typing import Any

from pyinfra import host
from pyinfra.api import deploy

from pyinfra_gpunode.facts.nvidia import NvidiaGpus
from pyinfra_gpunode.operations import cdi, containerd, kernel, nvidia, unattended_upgrades

logger = logging.getLogger(__name__)


@deploy("Register the nvidia runtime with containerd")
def nvidia_runtime_registered(settings: dict[str, Any]) -> None:
    """
    Write the nvidia runtime drop-in, then restart containerd one node at a time where needed.

    + settings: validated host data (``pyinfra_gpunode.hostdata.validate``)
    """
    containerd.nvidia_runtime(
        name="containerd: nvidia runtime registered",
        binary=settings["gpunode_nvidia_runtime_binary"],
        systemd_cgroup=settings["gpunode_nvidia_systemd_cgroup"],
        default_runtime=settings["gpunode_nvidia_default_runtime"],
        cdi_spec_dirs=settings["gpunode_cdi_spec_dirs"],
        dropin_dir=settings["gpunode_containerd_dropin_dir"],
        binary_required=settings["gpunode_runtime_binary_required"],
    )
    if settings["gpunode_containerd_restart"] == "rolling":
        containerd.restarted_if_pending(name="containerd: restarted one node at a time", _serial=True)


@deploy("Prepare a Kubernetes GPU node")
def gpu_node_prepared(settings: dict[str, Any]) -> None:
    """
    Prepare the node in dependency order: kernel held, unattended-upgrades and needrestart,
    nouveau, then on nodes with an NVIDIA GPU the driver, Fabric Manager, the container toolkit
    and the CDI spec, and last the containerd runtime with its one-node-at-a-time restart.

    + settings: validated host data (``pyinfra_gpunode.hostdata.validate``)
    """
    kernel.held(name="kernel: held", present=settings["gpunode_kernel_hold"])
    unattended_upgrades.configured(
        name="unattended-upgrades and needrestart: configured",
        mode=settings["gpunode_unattended_upgrades"],
        blacklist=settings["gpunode_unattended_blacklist"],
        needrestart_keep=settings["gpunode_needrestart_keep"],
    )
    kernel.nouveau_blacklisted(name="nouveau: blacklisted")
    if host.get_fact(NvidiaGpus)["gpus"]:
        nvidia.driver(
            name="NVIDIA driver: installed and held",
            branch=settings["gpunode_driver_branch"],
            version=settings["gpunode_driver_version"],
            flavor=settings["gpunode_driver_flavor"],
            allow_dkms=settings["gpunode_allow_dkms"],
            mok_enrolled=settings["gpunode_mok_enrolled"],
            reboot=settings["gpunode_reboot"],
        )
        nvidia.fabric_manager(name="Fabric Manager: matches the driver")
        nvidia.container_toolkit(
            name="NVIDIA Container Toolkit: installed and held",
            source=settings["gpunode_toolkit_source"],
            version=settings["gpunode_toolkit_version"],
            deb_dir=settings["gpunode_toolkit_deb_dir"],
        )
        cdi.spec(name="CDI spec: current for the loaded driver", path=settings["gpunode_cdi_spec_path"])
    else:
        logger.warning("%sno NVIDIA GPU: driver, Fabric Manager, toolkit and CDI steps skipped", host.print_prefix)
    nvidia_runtime_registered(settings)  # type: ignore[call-arg, arg-type]  # pyinfra types @deploy as an op
