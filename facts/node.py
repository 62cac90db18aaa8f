"""Everything the deploys read from a node, in one command."""

from __future__ import annotations

from typing import ClassVar, TypedDict, cast

from pyinfra.api import FactBase
from pyinfra.facts.server import LinuxDistribution, LinuxDistributionDict
from typing_extensions import override

from pyinfra_gpunode.facts._composite import Part, joined_command, split_values
from pyinfra_gpunode.facts.gpus import NvidiaGpus, PciInfo
from pyinfra_gpunode.facts.identity import NodeIdentity
from pyinfra_gpunode.facts.kernel import HostPrepInfo, HostPrepState
from pyinfra_gpunode.facts.readiness import NodeReadiness, NodeReadinessInfo
from pyinfra_gpunode.memo import by_content
from pyinfra_gpunode.node_identity import Reported

KIND_PART = "@@gpunode-kind:"


class NodeKindInfo(TypedDict):
    """``NodeKind``'s value."""

    distribution: LinuxDistributionDict
    gpus: PciInfo


@by_content  # a fleet's nodes send the same release files; pyinfra's process makes a directory each time
def _distribution(lines: list[str]) -> LinuxDistributionDict:
    """pyinfra's ``LinuxDistribution`` of the node's release files ``lines``, as that fact returns it."""
    return LinuxDistribution().process(lines)


class NodeKind(FactBase[NodeKindInfo]):
    """
    Returns in one command what decides which steps a node gets: pyinfra's ``LinuxDistribution``
    and ``NvidiaGpus``, each as that fact returns it.

    .. code:: python

        {
            "distribution": {"name": "Debian", "major": 13, "minor": None, "release_meta": {"ID": "debian", ...}},
            "gpus": {"gpus": [{"address": "0000:07:00.0", "class": "0x030200", "device": "0x20b0"}],
                     "nvswitches": [], "nvswitch": False},
        }
    """

    parts: ClassVar[dict[str, Part]] = {
        "distribution": Part(
            LinuxDistribution, script=lambda arguments: f"({LinuxDistribution().command()})", read=_distribution
        ),
        "gpus": Part(NvidiaGpus),
    }

    @override
    def command(self) -> str:
        return joined_command(KIND_PART, self.parts, {})

    @override
    def process(self, output: list[str]) -> NodeKindInfo:
        return cast(NodeKindInfo, split_values(KIND_PART, self.parts, output))


PART = "@@gpunode-node:"


class NodeSnapshotInfo(TypedDict):
    """``NodeSnapshot``'s value."""

    kind: NodeKindInfo
    prep: HostPrepInfo
    readiness: NodeReadinessInfo
    identity: Reported


class NodeSnapshot(FactBase[NodeSnapshotInfo]):
    """
    Returns in one command ``NodeKind``, ``HostPrepState`` for ``nouveau_path``,
    ``NodeReadiness`` for ``binary`` (which hold every other fact the deploys read before they
    change anything) and ``NodeIdentity``, each as that fact returns it.

    + binary: path of the nvidia runtime binary
    + nouveau_path: modprobe.d file meant to blacklist nouveau

    .. code:: python

        {
            "kind": {"distribution": {"name": "Debian", ...}, "gpus": {"gpus": [...], ...}},
            "prep": {"kernel": {...}, "unattended": {...}, "nouveau": {...}},
            "readiness": {"host": {...}, "nvml": None, "toolkit": {...}, "cdi": [], "containerd": {...}, ...},
            "identity": {"hostname": "gpu-a", "override": None, "machine_id": "4c4c...", "boot_id": "0f6a..."},
        }
    """

    parts: ClassVar[dict[str, Part]] = {
        "kind": Part(NodeKind),
        "prep": Part(HostPrepState, lambda arguments: {"path": arguments["nouveau_path"]}),
        "readiness": Part(NodeReadiness, lambda arguments: {"binary": arguments["binary"]}),
        "identity": Part(NodeIdentity),
    }

    @override
    def command(self, binary: str, nouveau_path: str) -> str:
        return joined_command(PART, self.parts, {"binary": binary, "nouveau_path": nouveau_path}) + "; true"

    @override
    def process(self, output: list[str]) -> NodeSnapshotInfo:
        return cast(NodeSnapshotInfo, split_values(PART, self.parts, output))
