"""Persistence mode: whether a node keeps its GPUs initialised while no program uses them (no I/O).

Without it the driver tears a GPU's state down when its last client exits and builds it again at the next
(seconds per GPU on datacenter parts, at every pod start; ECC and clock settings reset with it). NVIDIA's
answer is the ``nvidia-persistenced`` daemon, enabled and running on every datacenter node. ``auto`` asks
for it where a GPU is a datacenter one: PCI class 0x0302 (3D controller: A100, H100, H200, L40S, ...),
not 0x0300 (VGA: workstation and consumer cards, where a display server holds the GPU anyway).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MODES = ("auto", "on", "off")
UNIT = "nvidia-persistenced.service"
DATACENTER_CLASS = "0x0302"


def wanted(mode: str, gpu_classes: Sequence[str]) -> bool | None:
    """Whether persistence mode is asked on the node (``mode``: one of ``MODES``; ``gpu_classes``: its GPUs'
    PCI classes), or None on a node without an NVIDIA GPU."""
    if not gpu_classes:
        return None
    if mode == "auto":
        return any(found.startswith(DATACENTER_CLASS) for found in gpu_classes)
    return mode == "on"


def unit_change(want: bool, unit: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """``(the systemctl verb that brings nvidia-persistenced where asked, or None; why it cannot be, or
    None)`` from the unit's states (``unit``: ``load``, ``active``, ``enabled``; None without systemctl)."""
    if unit is None:
        return None, "no systemctl on the node: nvidia-persistenced is not managed here"
    if want:
        installed = unit.get("load") == "loaded" or unit.get("enabled") not in (None, "not-found")
        if unit.get("load") is None and installed:  # systemd does not run: is-enabled answers offline
            return None, f"systemd does not run on this node (an image or chroot): {UNIT} is not started here"
        if unit.get("load") == "masked":
            return None, f"{UNIT} is masked: unmask it to turn persistence mode on"
        if not installed:
            return None, (
                f"{UNIT} is not installed: persistence mode stays off until the "
                "driver's nvidia-persistenced package is installed"
            )
        if unit.get("active") != "active" or unit.get("enabled") not in ("enabled", "static", "alias"):
            return "enable", None
        return None, None
    if unit.get("active") == "active" or unit.get("enabled") == "enabled":
        return "disable", None
    return None, None


def readiness_problem(
    want: bool | None, unit: Mapping[str, Any] | None, devices: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why persistence mode is not as asked (only an ask for it on is judged), or None."""
    if not want:
        return None
    if unit is not None and unit.get("load") is not None:  # systemd runs here (not an image or chroot)
        load, active = unit.get("load"), unit.get("active")
        state = ("masked" if load == "masked" else "not installed") if load != "loaded" else active
        if state != "active":
            return f"persistence mode is asked on, but {UNIT} is {state or 'unknown'}"
    off = [str(device.get("index")) for device in devices if device.get("persistence_mode") is False]
    if off:
        return f"persistence mode is asked on, but NVML reports it off on GPU(s) {', '.join(off)}"
    return None
