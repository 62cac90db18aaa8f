"""One read per node (``NodeSnapshot``) for the facts the deploys read before they change anything.

The first fact asked for through ``node_fact`` on a node reads the node's whole snapshot; later
asks take their part of it while nothing can have changed the node since the read: no operation
of the node has completed with a change, or failed, since, and the read was taken in the same
pass (prepare, or execute) or, when pyinfra skips change detection (``-y``: the operations run
right after the prepare pass, no prompt between), in the prepare pass. Otherwise, for a fact the
snapshot does not hold with the arguments asked for, and on pyinfra-testing's fake hosts,
``node_fact`` reads that single fact.

Ask through ``node_fact`` only before an operation yields its first command; read again with
``host.get_fact`` once a command ran.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pyinfra import host, state
from pyinfra.api import FactBase, State
from pyinfra.api.host import Host
from pyinfra.facts.server import LinuxDistribution

from pyinfra_gpunode.facts.cdi import CdiSpecs
from pyinfra_gpunode.facts.containerd import (
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdNodeState,
    ContainerdService,
)
from pyinfra_gpunode.facts.kernel import NOUVEAU_CONF, KernelState, NouveauBlacklist
from pyinfra_gpunode.facts.node import NodeSnapshot, NodeSnapshotInfo
from pyinfra_gpunode.facts.nvidia import (
    NodeKind,
    NvidiaContainerToolkit,
    NvidiaDriver,
    NvidiaGpus,
    NvidiaHostState,
    NvmlInfo,
)
from pyinfra_gpunode.facts.readiness import NodeReadiness
from pyinfra_gpunode.facts.unattended_upgrades import UnattendedUpgradesState
from pyinfra_gpunode.operations._internals import current_host, current_state, node_changes

T = TypeVar("T")

DEFAULT_BINARY = "/usr/bin/nvidia-container-runtime"


@dataclass(frozen=True)
class _Read:
    executing: bool
    changes: int  # the node's completed operations that changed it or failed, at the read
    arguments: dict[str, str]  # NodeSnapshot's
    value: NodeSnapshotInfo


# Each fact the snapshot holds: where in it, and the fact's arguments it was read with (from the
# snapshot's own arguments and value).
Part = Callable[[NodeSnapshotInfo], Any]
Held = Callable[[dict[str, str], NodeSnapshotInfo], dict[str, Any]]
_NONE: Held = lambda arguments, value: {}  # noqa: E731
_PARTS: dict[type[FactBase[Any]], tuple[Part, Held]] = {
    NodeKind: (lambda s: s["kind"], _NONE),
    LinuxDistribution: (lambda s: s["kind"]["distribution"], _NONE),
    KernelState: (lambda s: s["prep"]["kernel"], _NONE),
    UnattendedUpgradesState: (lambda s: s["prep"]["unattended"], _NONE),
    NouveauBlacklist: (lambda s: s["prep"]["nouveau"], lambda a, s: {"path": a["nouveau_path"]}),
    NvidiaHostState: (lambda s: s["readiness"]["host"], _NONE),
    NvidiaDriver: (lambda s: s["readiness"]["host"]["driver"], _NONE),
    NvidiaGpus: (lambda s: s["readiness"]["host"]["pci"], _NONE),
    NvmlInfo: (lambda s: s["readiness"]["nvml"], _NONE),
    NvidiaContainerToolkit: (lambda s: s["readiness"]["toolkit"], _NONE),
    CdiSpecs: (lambda s: s["readiness"]["cdi"], _NONE),
    ContainerdNodeState: (lambda s: s["readiness"]["containerd"], lambda a, s: {"binary": a["binary"]}),
    ContainerdService: (lambda s: s["readiness"]["containerd"]["service"], _NONE),
    ContainerdConfigFiles: (lambda s: s["readiness"]["containerd"]["files"], _NONE),
    ContainerdConfigDump: (  # of the config the unit starts containerd with
        lambda s: s["readiness"]["containerd"]["dump"],
        lambda a, s: {"config_path": s["readiness"]["containerd"]["files"]["main_path"]},
    ),
    ContainerdCriLoaded: (lambda s: s["readiness"]["cri"], _NONE),  # None: read without a journal, not held
    NodeReadiness: (lambda s: s["readiness"], lambda a, s: {"binary": a["binary"]}),
}

# Per run (State): host name -> the node's last snapshot; the runtime binary its snapshots read.
_READS: weakref.WeakKeyDictionary[State, dict[str, _Read]] = weakref.WeakKeyDictionary()
_BINARIES: weakref.WeakKeyDictionary[State, dict[str, str]] = weakref.WeakKeyDictionary()


def snapshot_binary(binary: str) -> None:
    """This node's snapshots check for runtime ``binary`` (its host data), so the containerd and
    readiness facts asked for with it come from the snapshot."""
    if isinstance(current_host(), Host):
        _BINARIES.setdefault(current_state(), {})[host.name] = binary


def node_fact(fact: type[FactBase[T]], **kwargs: Any) -> T:
    """``host.get_fact(fact, **kwargs)``, from this node's snapshot when that is current (see the module)."""
    node = current_host()
    if fact not in _PARTS or not isinstance(node, Host):
        return host.get_fact(fact, **kwargs)
    part, held_with = _PARTS[fact]
    run = current_state()
    reads = _READS.setdefault(run, {})
    read = reads.get(node.name)
    changes = node_changes(run, node)
    if read is None or not _current(read, changes):
        if read is not None and read.executing == state.is_executing:  # outdated in this pass
            return host.get_fact(fact, **kwargs)
        arguments = {
            "binary": _BINARIES.get(run, {}).get(node.name, DEFAULT_BINARY),
            "nouveau_path": NOUVEAU_CONF,
        }
        read = _Read(state.is_executing, changes, arguments, host.get_fact(NodeSnapshot, **arguments))
        reads[node.name] = read
    wanted = _arguments(fact, kwargs)
    held = _arguments(fact, held_with(read.arguments, read.value))
    value = part(read.value)
    if wanted != held or value is None:
        return host.get_fact(fact, **kwargs)
    return cast(T, value)


def _current(read: _Read, changes: int) -> bool:
    same_pass = read.executing == state.is_executing
    return read.changes == changes and (same_pass or not state.should_check_for_changes())


def _arguments(fact: type[FactBase[Any]], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = inspect.signature(fact().command).bind(**kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
