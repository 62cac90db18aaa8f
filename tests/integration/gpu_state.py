"""Plant a GPU node's state into a Debian root: what the facts read, as a real node has it.

A PCI entry under ``/sys/bus/pci/devices``, the loaded module's ``/sys/module/nvidia/version`` and
``/proc/driver/nvidia/version``, and Debian's real ``libnvidia-ml`` (from the ``libnvidia-ml1``
package, fetched with a private apt configuration into the cache) copied where a runfile or image
driver puts it, outside the package manager, and registered with ``ldconfig``. The files are
written into the root's own directories (a chroot has no sysfs or procfs mounted there); on a
booted host the same tree is bind-mounted over the live ``/sys`` and ``/proc`` paths.
"""

from __future__ import annotations

import fcntl
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.fleet.archive import debian_mirror
from tests.realbin.debian import KEYRING, _apt_options, cache_dir

DRIVER = "550.163.01"  # Debian 13's libnvidia-ml1
LIBRARY_DIR = "/usr/local/nvidia/lib64"
LIBRARY = f"{LIBRARY_DIR}/libnvidia-ml.so.{DRIVER}"
GPU_ADDRESS = "0000:41:00.0"


def libnvidia_ml() -> Path:
    """Debian 13's ``libnvidia-ml.so.<DRIVER>``, unpacked from ``libnvidia-ml1`` on first use."""
    base = cache_dir() / "nvidia"
    library = base / "unpacked" / f"usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.{DRIVER}"
    if library.exists():
        return library
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            return library
        scratch = base / "apt"
        for sub in ("lists/partial", "cache/archives/partial", "debs"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        (scratch / "sources.list").write_text(f"deb [signed-by={KEYRING}] {debian_mirror()} trixie non-free\n")
        opts, debs = _apt_options(scratch), scratch / "debs"
        if not list(debs.glob(f"libnvidia-ml1_{DRIVER}-*_amd64.deb")):
            subprocess.run(["apt-get", *opts, "update"], check=True)
            subprocess.run(["apt-get", *opts, "download", "libnvidia-ml1"], check=True, cwd=debs)
        (deb,) = debs.glob(f"libnvidia-ml1_{DRIVER}-*_amd64.deb")
        subprocess.run(["rm", "-rf", str(base / "unpacked")], check=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(base / "unpacked")], check=True)
    return library


def write(root: Path, path: str, text: str, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def plant_gpu(tree: Path, address: str = GPU_ADDRESS, device: str = "0x2331") -> None:
    """An H100 PCIe as sysfs shows it (``tree`` stands for the node's ``/sys/bus/pci/devices``)."""
    for name, value in (("vendor", "0x10de"), ("class", "0x030200"), ("device", device)):
        write(tree / address, name, value + "\n")


def plant_module(sys_module: Path, proc_driver: Path, version: str = DRIVER) -> None:
    """The loaded proprietary module: ``/sys/module/nvidia/version`` and ``/proc/driver/nvidia/version``."""
    write(sys_module, "nvidia/version", version + "\n")
    write(
        proc_driver, "nvidia/version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Apr  1 00:00:00 UTC 2025\n"
        "GCC version:  gcc version 14.2.0 (Debian 14.2.0-19)\n",
    )  # fmt: skip


def plant_library(root: Path) -> None:
    """The real libnvidia-ml outside any package, in the loader's cache (as runfile installs do)."""
    target = root / LIBRARY.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(libnvidia_ml().read_bytes())
    write(root, "/etc/ld.so.conf.d/nvidia.conf", LIBRARY_DIR + "\n")
    subprocess.run(["chroot", str(root), "ldconfig"], check=True)


def plant_device_nodes(root: Path, *names: str) -> None:
    """The NVIDIA character devices ``names`` (``nvidiactl``, ``nvidia0``) in the root's own ``/dev``."""
    minors = {"nvidiactl": 255}
    for name in names:
        node = root / "dev" / name
        node.parent.mkdir(parents=True, exist_ok=True)
        minor = minors.get(name, int(name.removeprefix("nvidia")) if name.removeprefix("nvidia").isdigit() else 254)
        subprocess.run(["mknod", "-m", "666", str(node), "c", "195", str(minor)], check=True)


def plant_toolkit(root: Path, version: str = "1.17.8") -> None:
    """``nvidia-ctk`` and ``nvidia-container-runtime`` on PATH outside dpkg (a toolkit from a tarball).

    NVIDIA's toolkit is in no Debian archive, so these two stand in for its binaries: they answer
    ``--version`` as the real ones do.
    """
    ctk = f"#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version {version}'\n"
    write(root, "/usr/local/bin/nvidia-ctk", ctk, 0o755)
    write(root, "/usr/local/bin/nvidia-container-runtime", f"#!/bin/sh\necho 'runc version {version}'\n", 0o755)


def cdi_spec(driver: str = DRIVER, cdi_version: str = "0.5.0") -> str:
    """A spec in nvidia-ctk's layout (sorted keys) for the planted GPU and driver."""
    return f"""---
cdiVersion: {cdi_version}
containerEdits:
  deviceNodes:
  - hostPath: /dev/nvidiactl
    path: /dev/nvidiactl
  mounts:
  - containerPath: {LIBRARY_DIR}/libnvidia-ml.so.{driver}
    hostPath: {LIBRARY_DIR}/libnvidia-ml.so.{driver}
    options:
    - ro
    - nosuid
    - nodev
    - bind
devices:
- containerEdits:
    deviceNodes:
    - hostPath: /dev/nvidia0
      path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - hostPath: /dev/nvidia0
      path: /dev/nvidia0
  name: all
kind: nvidia.com/gpu
"""


PLANTED = "/root/gpunode-planted-driver"
PERSISTENCED = b"""[Unit]
Description=NVIDIA Persistence Daemon (stand-in)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
UNPLANT = "umount /sys/bus/pci/devices; umount /sys/module; umount /proc/driver"


def plant_preinstalled_driver(on: Callable[[str, bytes | None], object]) -> None:
    """A booted test host as a GPU node whose driver came from no package (a runfile or image): an H100's PCI
    entry, the loaded module's version files (bind-mounted over the live ``/sys`` and ``/proc`` paths;
    ``UNPLANT`` unmounts them), Debian's real libnvidia-ml in the loader's cache, stand-ins for ``nvidia-ctk``
    and the runtime, a CDI spec, and ``nvidia-persistenced.service`` as the driver installs it, disabled (a
    stand-in daemon: the real one exits without a GPU device it can open). ``on(command, stdin)`` runs a
    command on the host and raises where it fails."""
    sys_files = {
        "pci/0000:41:00.0/vendor": "0x10de", "pci/0000:41:00.0/class": "0x030200",
        "pci/0000:41:00.0/device": "0x2331", "module/nvidia/version": DRIVER,
    }  # fmt: skip
    script = [f"mkdir -p {PLANTED}/{path.rsplit('/', 1)[0]} && echo {value} > {PLANTED}/{path}"
              for path, value in sys_files.items()]  # fmt: skip
    proc = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Tue Apr  1 00:00:00 UTC 2025"
    script += [
        f"mkdir -p {PLANTED}/proc/nvidia && echo '{proc}' > {PLANTED}/proc/nvidia/version",
        f"mount --bind {PLANTED}/pci /sys/bus/pci/devices",
        f"mount --bind {PLANTED}/module /sys/module",
        f"mount --bind {PLANTED}/proc /proc/driver",
    ]
    on(" && ".join(script), None)
    on(f"mkdir -p {LIBRARY_DIR} && cat > {LIBRARY}", libnvidia_ml().read_bytes())
    on(f"echo {LIBRARY_DIR} > /etc/ld.so.conf.d/nvidia.conf && ldconfig", None)
    ctk = "#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\n"
    on("cat > /usr/local/bin/nvidia-ctk && chmod 755 /usr/local/bin/nvidia-ctk", ctk.encode())
    runtime = "/usr/bin/nvidia-container-runtime"
    on(f"cat > {runtime} && chmod 755 {runtime}", b"#!/bin/sh\n")
    on("mkdir -p /etc/cdi && cat > /etc/cdi/nvidia.yaml", cdi_spec().encode())
    on("cat > /etc/systemd/system/nvidia-persistenced.service && systemctl daemon-reload", PERSISTENCED)


def boot_unit(description: str, script: str, after: str = "", before: str = "ssh.service") -> str:
    """A oneshot unit that runs the shell file ``script`` at every boot, before ``before`` (the planted state is
    there before anything reads it), after ``after`` where given."""
    ordering = f"After={after}\n" if after else ""
    return (
        f"[Unit]\nDescription={description}\n{ordering}Before={before}\n\n"
        f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh {script}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
