"""Everything the deploys read from a node, in one command."""

from __future__ import annotations

from typing import ClassVar, TypedDict, cast

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode.facts._composite import Part, joined_command, split_values
from pyinfra_gpunode.facts.kernel import HostPrepInfo, HostPrepState
from pyinfra_gpunode.facts.nvidia import NodeKind, NodeKindInfo
from pyinfra_gpunode.facts.readiness import NodeReadiness, NodeReadinessInfo

PART = "@@gpunode-node:"


class NodeSnapshotInfo(TypedDict):
    """``NodeSnapshot``'s value."""

    kind: NodeKindInfo
    prep: HostPrepInfo
    readiness: NodeReadinessInfo


class NodeSnapshot(FactBase[NodeSnapshotInfo]):
    """
    Returns in one command ``NodeKind``, ``HostPrepState`` for ``nouveau_path`` and
    ``NodeReadiness`` for ``binary`` (which hold every other fact the deploys read before they
    change anything), each as that fact returns it.

    + binary: path of the nvidia runtime binary
    + nouveau_path: modprobe.d file meant to blacklist nouveau

    .. code:: python

        {
            "kind": {"distribution": {"name": "Debian", ...}, "gpus": {"gpus": [...], ...}},
            "prep": {"kernel": {...}, "unattended": {...}, "nouveau": {...}},
            "readiness": {"host": {...}, "nvml": None, "toolkit": {...}, "cdi": [], "containerd": {...}, ...},
        }
    """

    parts: ClassVar[dict[str, Part]] = {
        "kind": Part(NodeKind),
        "prep": Part(HostPrepState, lambda arguments: {"path": arguments["nouveau_path"]}),
        "readiness": Part(NodeReadiness, lambda arguments: {"binary": arguments["binary"]}),
    }

    @override
    def command(self, binary: str, nouveau_path: str) -> str:
        return joined_command(PART, self.parts, {"binary": binary, "nouveau_path": nouveau_path}) + "; true"

    @override
    def process(self, output: list[str]) -> NodeSnapshotInfo:
        return cast(NodeSnapshotInfo, split_values(PART, self.parts, output))
