"""Everything the deploys read from a node, in one command."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase
from pyinfra.facts.server import LinuxDistribution, LinuxDistributionDict
from typing_extensions import override

from pyinfra_gpunode.facts.gpus import PCI_SCRIPT, NvidiaGpus, PciInfo
from pyinfra_gpunode.facts.kernel import HostPrepInfo, HostPrepState
from pyinfra_gpunode.facts.readiness import NodeReadiness, NodeReadinessInfo
from pyinfra_gpunode.sections import join_parts, split_parts

KIND_PART = "@@gpunode-kind:"


class NodeKindInfo(TypedDict):
    """``NodeKind``'s value."""

    distribution: LinuxDistributionDict
    gpus: PciInfo


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

    @override
    def command(self) -> str:
        distribution = LinuxDistribution().command()
        return f"echo '{KIND_PART}distribution'; ({distribution}); echo '{KIND_PART}gpus'; {PCI_SCRIPT}"

    @override
    def process(self, output: list[str]) -> NodeKindInfo:
        parts = split_parts(output, KIND_PART, ("distribution", "gpus"))
        return {
            "distribution": LinuxDistribution().process(parts["distribution"]),
            "gpus": NvidiaGpus().process(parts["gpus"]),
        }


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

    @override
    def command(self, binary: str, nouveau_path: str) -> str:
        parts = {
            "kind": NodeKind().command(),
            "prep": HostPrepState().command(nouveau_path),
            "readiness": NodeReadiness().command(binary),
        }
        return join_parts(PART, parts) + "; true"

    @override
    def process(self, output: list[str]) -> NodeSnapshotInfo:
        parts = split_parts(output, PART, ("kind", "prep", "readiness"))
        return {
            "kind": NodeKind().process(parts["kind"]),
            "prep": HostPrepState().process(parts["prep"]),
            "readiness": NodeReadiness().process(parts["readiness"]),
        }
