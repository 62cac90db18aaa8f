"""The deploys' building blocks as pyinfra ``@deploy`` functions, driven by validated host data."""

from __future__ import annotations

from typing import Any

from pyinfra.api import deploy

from pyinfra_gpunode.operations import containerd


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
