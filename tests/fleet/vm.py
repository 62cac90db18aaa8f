"""A host as a qemu VM under software emulation (TCG): a real kernel, for module loading and reboots.

The host's base image is an ext4 file system made (``mkfs.ext4 -d``, no mount of the image) from a
read-only overlay of its identity over the shared root, with the root's own kernel and initrd
booted directly. Writes go to a qcow2 layer over it, so a reset only drops that layer. User-mode
networking with ``restrict=on``: SSH is forwarded from ``127.0.0.1:<port>``, and the guest's
``10.0.2.100:80`` is relayed to the archive; nothing else leaves the VM.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import processes
from .archive import archive_host
from .identity import write_hosts_file
from .nspawn import is_mounted
from .state import HostState

ARCHIVE_ADDRESS = "10.0.2.100"
IMAGE_SIZE = "4G"


def boot(state: HostState, root: Path) -> None:
    d = state.directory
    disk = d / "disk.qcow2"
    if not disk.exists():
        _make_base_image(state, root)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(d / "base.raw"), "-F", "raw", str(disk)],
            check=True,
        )
    kernel_args = "root=/dev/vda rw console=ttyS0 net.ifnames=0 testhost.slirp panic=0 quiet"
    netdev = (
        f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{state.port}-:22,"
        f"guestfwd=tcp:{ARCHIVE_ADDRESS}:80-cmd:socat STDIO TCP:{archive_host()}:80"
    )
    qemu = [
        "qemu-system-x86_64",
        "-name",
        state.name,
        "-accel",
        "tcg,tb-size=128",
        "-smp",
        "1",
        "-m",
        "1024",
        "-device",
        "pvpanic",
        "-action",
        "panic=exit-failure",
        "-display",
        "none",
        "-serial",
        f"file:{d / 'console.log'}",
        "-monitor",
        "none",
        "-kernel",
        str(_newest(root / "boot", "vmlinuz-*")),
        "-initrd",
        str(_newest(root / "boot", "initrd.img-*")),
        "-append",
        kernel_args,
        "-netdev",
        netdev,
        "-device",
        "virtio-net-pci,netdev=n0",
        "-device",
        "virtio-rng-pci",
        "-drive",
        f"file={disk},if=virtio,format=qcow2,discard=unmap",
    ]
    state.processes = [processes.start("qemu", qemu, d / "qemu.log")]
    state.save()


def stop(state: HostState) -> None:
    """Pull the plug: the disk layer is thrown away on reset and teardown anyway."""
    processes.stop(state.processes)
    state.processes = []
    state.save()


def wipe_disk(state: HostState) -> None:
    for name in ("disk.qcow2", "base.raw"):
        (state.directory / name).unlink(missing_ok=True)


def _make_base_image(state: HostState, root: Path) -> None:
    d = state.directory
    write_hosts_file(state.identity, root, state.name, ARCHIVE_ADDRESS)
    view = d / "image-source"
    view.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={state.identity}:{root}", str(view)],
        check=True,
    )
    try:
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-L", state.name, "-d", str(view), str(d / "base.raw"), IMAGE_SIZE],
            check=True,
            capture_output=True,
        )
    finally:
        if is_mounted(view):
            subprocess.run(["umount", str(view)], check=True)


def _newest(directory: Path, pattern: str) -> Path:
    candidates = sorted(directory.glob(pattern))
    if not candidates:
        raise RuntimeError(f"no {pattern} in {directory}: the root has no kernel")
    return candidates[-1]
