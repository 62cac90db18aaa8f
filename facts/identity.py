"""What a node says it is: its hostname, its machine id and the kubelet's ``--hostname-override``."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode.node_identity import KUBELET_FLAG_FILES, Reported, boot_id, kubelet_override, machine_id, reported
from pyinfra_gpunode.sections import marker, split_sections

NAME_BYTES = 300  # of the hostname (at most 64 on Linux) read
FLAG_LINES = 20  # lines naming --hostname-override read from each flag file


class NodeIdentity(FactBase[Reported]):
    """
    Returns what the node says it is (``node_identity.Reported``): its kernel hostname, the kubelet's
    ``--hostname-override`` where its flag files (kubeadm's ``kubeadm-flags.env``,
    ``/etc/default/kubelet``, ``/etc/sysconfig/kubelet``) set one, its ``/etc/machine-id`` and the
    kernel's boot id (each ``""`` where it holds none). Each is read within a bound; nothing is trusted as a name until
    ``node_identity.node_name`` accepts it.

    .. code:: python

        {"hostname": "gpu-a", "override": None, "machine_id": "4c4c4544004d3510804bb4c04f4e3732",
         "boot_id": "0f6a1c52-8d0e-4f4b-9d1e-3c2f5a7b9e10"}
    """

    @override
    def command(self) -> str:
        flags = " ".join(shlex.quote(path) for path in KUBELET_FLAG_FILES)
        return "; ".join(
            [
                marker("hostname"),
                f"uname -n | head -c {NAME_BYTES}; echo",
                marker("machine_id"),
                "head -c 64 /etc/machine-id 2>/dev/null; echo",
                marker("boot_id"),
                "head -c 64 /proc/sys/kernel/random/boot_id 2>/dev/null; echo",
                marker("kubelet"),
                f'for f in {flags}; do if [ -f "$f" ]; then grep -h -m {FLAG_LINES} -- --hostname-override "$f" '
                f"| cut -c 1-1000; fi; done; true",
            ]
        )

    @override
    def process(self, output: list[str]) -> Reported:
        sections = split_sections(output)
        names = [line for line in sections.get("hostname", []) if line]
        return reported(
            names[0] if names else "",
            kubelet_override(sections.get("kubelet", [])),
            machine_id("".join(sections.get("machine_id", []))),
            boot_id("".join(sections.get("boot_id", []))),
        )
