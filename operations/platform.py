"""Nodes whose containerd a platform (k3s, RKE2, k0s, EKS nodeadm) owns: refused before anything changes on
them, except k3s and RKE2 where they add the nvidia runtime themselves (their unit restarted when due)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import StringCommand, operation

from pyinfra_gpunode import shell
from pyinfra_gpunode.facts.platform import ContainerdPlatform
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.platform import K3S_SOCKET, rancher_config, rancher_nvidia, rancher_restart_reason, refusal

_RESTART_AND_VERIFY = shell.script(Path(__file__).parent / "shell" / "platform-restart.sh")


@operation()
def supported() -> Generator[Any, Any, None]:
    """
    Fail this node when a platform owns its containerd: k3s or RKE2 (containerd inside their
    agent's unit, its config generated at every start) where they do not add the nvidia runtime
    themselves (no ``nvidia-container-runtime`` in ``/usr/local/nvidia/toolkit`` or ``/usr/bin``),
    k0s (``/etc/k0s/containerd.toml``) or EKS nodeadm (``/etc/containerd/config.toml`` rewritten
    from its NodeConfig at every boot).

    An edit of such a node's containerd config is lost or never read, and ``containerd.service``
    is not where its containerd runs. The failure names the platform, what was found of it, and
    where the nvidia runtime goes instead (for EKS nodeadm: the NodeConfig's
    ``spec.containerd.config``). Put it first: on a refused node nothing else should run. A dry
    run prints the refusal as the node's plan.

    **Example:**

    .. code:: python

        platform.supported(name="containerd: not owned by a platform")
    """
    found = node_fact(ContainerdPlatform)
    problem = refusal(found)
    if problem:
        yield fail(problem)
        return
    host.noop("no platform owns containerd")


@operation(is_idempotent=False, idempotent_notice="Restarts only while the generated config lacks nvidia.")
def unit_restarted(timeout: int = 60) -> Generator[Any, Any, None]:
    """
    Restart the k3s or RKE2 unit (``k3s``, ``k3s-agent``, ``rke2-server``, ``rke2-agent``) whose
    generated containerd config has no nvidia runtime yet although the agent finds the toolkit's
    ``nvidia-container-runtime``: at its start the agent adds the nvidia runtimes itself. The
    kubelet restarts with the unit.

    + timeout: seconds the unit may take to regenerate its config with the nvidia runtime and
      bring its CRI plugin up on ``/run/k3s/containerd/containerd.sock``

    Verified by the regenerated config (written after the restart, defining ``nvidia``) and by
    ``ctr --address /run/k3s/containerd/containerd.sock plugins ls`` listing the CRI plugin as
    ``ok``; otherwise the host fails with what was missing. Nothing was written, so nothing is
    rolled back. Elsewhere it does nothing.

    **Example:**

    .. code:: python

        platform.unit_restarted(name="k3s: restarted with the nvidia runtime", timeout=120)
    """
    found = node_fact(ContainerdPlatform)
    if rancher_nvidia(found) != "restart" or not found["name"] or not found["unit"]:
        host.noop("no platform unit needs a restart for the nvidia runtime")
        return
    if state.is_executing:
        logger.info("%srestarting %s", host.print_prefix, rancher_restart_reason(found))
    ticks = str(max(1, int(timeout)) * 5)
    config = rancher_config(found["name"])
    yield StringCommand(
        shell.command(
            _RESTART_AND_VERIFY, "gpunode-platform-restart", found["unit"], config, K3S_SOCKET, ticks, found["name"]
        )
    )
