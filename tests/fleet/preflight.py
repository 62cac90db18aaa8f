"""What the fleet needs from the machine, checked before anything is touched."""

from __future__ import annotations

import os
import shutil

NSPAWN_TOOLS = ("debootstrap", "systemd-nspawn", "socat", "ssh", "ssh-keygen", "ip", "mount")
VM_TOOLS = ("debootstrap", "qemu-system-x86_64", "qemu-img", "mkfs.ext4", "socat", "ssh", "ssh-keygen")


class FleetUnavailable(RuntimeError):
    """The machine cannot run the fleet; the message says why."""


def check(vm: bool = False) -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("the test fleet needs root (overlay mounts, network namespaces, cgroups)")
    missing = [tool for tool in (VM_TOOLS if vm else NSPAWN_TOOLS) if shutil.which(tool) is None]
    if missing:
        problems.append(f"missing {', '.join(missing)} (run scripts/setup.sh)")
    if problems:
        raise FleetUnavailable("; ".join(problems))
