"""Refuse a node whose Linux distribution the deploys do not support, before anything changes on it."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, operation
from pyinfra.facts.server import LinuxDistribution

from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._shared import node_fact

SUPPORTED = ("debian", "ubuntu")


def refusal(release_meta: Mapping[str, Any], supported: Sequence[str] = SUPPORTED) -> str | None:
    """Why a node with this ``/etc/os-release`` is refused (naming its ``ID`` and ``VERSION_ID``); None if it is not."""
    distro = str(release_meta.get("ID") or "").strip().lower()
    if distro in supported:
        return None
    found = " ".join(str(release_meta[key]) for key in ("ID", "VERSION_ID") if release_meta.get(key))
    return (
        f"distribution {found or 'unknown (no /etc/os-release)'} is not supported "
        f"(supported: {', '.join(supported)}); nothing was changed on this node"
    )


@operation()
def supported(distributions: Sequence[str] = SUPPORTED) -> Generator[Any, Any, None]:
    """
    Fail this node unless it runs one of ``distributions`` (``/etc/os-release`` ``ID``).

    + distributions: os-release IDs the deploys support (Debian and Ubuntu: apt, dpkg,
      initramfs-tools and the driver packages they name)

    Put it first: on a refused node nothing else should run. A dry run prints the refusal,
    naming the distribution and its version (``rocky 9.4``), as the node's plan.

    **Example:**

    .. code:: python

        distribution.supported(name="distribution: supported")
    """
    if not distributions or not all(isinstance(name, str) and name for name in distributions):
        raise OperationValueError(f"distributions must be os-release IDs like 'debian', got {distributions!r}")
    release_meta = node_fact(LinuxDistribution)["release_meta"]
    problem = refusal(release_meta, distributions)
    if problem:
        yield fail(problem)
        return
    host.noop(f"distribution {release_meta['ID']} {release_meta.get('VERSION_ID', '')}".rstrip() + " is supported")
