"""Facts about the NVIDIA devices on the node's PCI bus: GPUs and NVSwitch bridges."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.sections import MARK, split_sections

# One NVIDIA PCI device ("class" is a keyword, hence the functional form).
PciDevice = TypedDict("PciDevice", {"address": str, "class": str, "device": str})


class PciInfo(TypedDict):
    """``NvidiaGpus``'s value (also ``NvidiaHostState``'s ``pci``)."""

    gpus: list[PciDevice]
    nvswitches: list[PciDevice]
    nvswitch: bool


# Print the NVIDIA PCI devices and the NVSwitch driver's devices (shell/nvidia-pci.sh).
PCI_COMMAND = shell.command(shell.script(Path(__file__).parent / "shell" / "nvidia-pci.sh"), "gpunode-nvidia-pci", MARK)


def parse_pci(sections: dict[str, list[str]]) -> PciInfo:
    gpus: list[PciDevice] = []
    switches: list[PciDevice] = []
    for line in sections.get("pci", []):
        parts = line.split()
        if len(parts) != 3:
            continue
        address, pci_class, device = parts
        entry: PciDevice = {"address": address, "class": pci_class, "device": device}
        if pci_class.startswith(("0x0300", "0x0302")):
            gpus.append(entry)
        elif pci_class.startswith("0x0680"):
            switches.append(entry)
    nvswitch_devices = [line.strip() for line in sections.get("nvswitch", []) if line.strip()]
    return {"gpus": gpus, "nvswitches": switches, "nvswitch": bool(switches or nvswitch_devices)}


class NvidiaGpus(FactBase[PciInfo]):
    """
    Returns the NVIDIA PCI devices (vendor ``0x10de``; no driver needed): GPUs (class
    ``0x0300``/``0x0302``), NVSwitch bridges (class ``0x0680``), and whether this is an
    NVSwitch system (such bridges, or a non-empty ``/proc/driver/nvidia-nvswitch/devices``).

    .. code:: python

        {
            "gpus": [{"address": "0000:07:00.0", "class": "0x030200", "device": "0x20b0"}],
            "nvswitches": [],
            "nvswitch": False,
        }
    """

    @override
    def command(self) -> str:
        return PCI_COMMAND

    @staticmethod
    def default() -> PciInfo:
        return parse_pci({})

    @override
    def process(self, output: list[str]) -> PciInfo:
        return parse_pci(split_sections(output))
