"""Refuse a node whose containerd a platform (k3s, RKE2, k0s, EKS nodeadm) owns, before anything changes on it."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import operation

from pyinfra_gpunode.facts.platform import ContainerdPlatform
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.platform import refusal


@operation()
def supported() -> Generator[Any, Any, None]:
    """
    Fail this node when a platform owns its containerd: k3s or RKE2 (containerd inside their
    agent's unit, its config generated at every start), k0s (``/etc/k0s/containerd.toml``) or
    EKS nodeadm (``/etc/containerd/config.toml`` rewritten from its NodeConfig at every boot).

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
