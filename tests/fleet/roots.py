"""Debian roots the hosts boot from, built with debootstrap and cached outside the repository.

A root is rebuilt when its recipe changes: the recipe (release, packages, files, commands and
the archive URI) is hashed into a stamp file next to the root. A lock file per root keeps
concurrent test runs from building the same root twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .archive import debian_mirror
from .paths import cache_dir, debs_dir, roots_dir

log = logging.getLogger(__name__)

BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "apt",
    "containerd",
    "unattended-upgrades",
    "sudo",
    "iproute2",
    "procps",
    "kmod",
    "ca-certificates",
)
KERNEL_PACKAGES = ("udev", "linux-image-cloud-amd64", "initramfs-tools")

# In a VM (kernel argument ``testhost.slirp``) the first NIC gets qemu's user-mode address; there
# is no default route, so only the forwarded archive address answers.
SLIRP_NETWORK_UNIT = """\
[Unit]
Description=Test host address on qemu's user-mode network
ConditionKernelCommandLine=testhost.slirp
BindsTo=sys-subsystem-net-devices-eth0.device
After=sys-subsystem-net-devices-eth0.device
Before=network.target ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=ip address add 10.0.2.15/24 dev eth0
ExecStart=ip link set eth0 up

[Install]
WantedBy=multi-user.target
"""

POST_FILES = {
    # Nothing listens on 127.0.0.1:53, so lookups fail at once; names hosts need are in /etc/hosts.
    "etc/resolv.conf": "nameserver 127.0.0.1\n",
    # Empty: each host gets its own id from its identity layer (or systemd makes one).
    "etc/machine-id": "",
    "etc/fstab": "",
    "etc/systemd/system/testhost-slirp-network.service": SLIRP_NETWORK_UNIT,
}
POST_COMMANDS = (
    # Host keys, hostname and D-Bus machine id come from each host's identity layer.
    "rm -f /etc/ssh/ssh_host_* /etc/hostname /var/lib/dbus/machine-id",
    "ln -sf /etc/systemd/system/testhost-slirp-network.service "
    "/etc/systemd/system/multi-user.target.wants/testhost-slirp-network.service",
    "apt-get clean",
)


@dataclass(frozen=True)
class RootRecipe:
    release: str
    with_kernel: bool = False
    packages: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        packages = BASE_PACKAGES + (KERNEL_PACKAGES if self.with_kernel else ())
        object.__setattr__(self, "packages", packages)

    @property
    def name(self) -> str:
        return f"{self.release}-vm" if self.with_kernel else self.release

    def digest(self, mirror: str) -> str:
        recipe = {
            "release": self.release,
            "packages": self.packages,
            "files": POST_FILES,
            "commands": POST_COMMANDS,
            "mirror": mirror,
        }
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def ensure_root(recipe: RootRecipe) -> Path:
    """The path of ``recipe``'s root, built first if missing or out of date."""
    base = roots_dir()
    base.mkdir(parents=True, exist_ok=True)
    root = base / recipe.name
    stamp = base / f"{recipe.name}.stamp"
    digest = recipe.digest(debian_mirror())
    with open(base / f"{recipe.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.is_dir() and stamp.exists() and stamp.read_text().strip() == digest:
            return root
        started = time.monotonic()
        fresh = base / f"{recipe.name}.new"
        _remove_tree(fresh)
        _debootstrap(recipe, fresh)
        _post_configure(fresh)
        _remove_tree(root)
        fresh.rename(root)
        stamp.write_text(digest + "\n")
        log.info("built root %s in %.0f s", recipe.name, time.monotonic() - started)
    return root


def _debootstrap(recipe: RootRecipe, target: Path) -> None:
    cache = debs_dir(recipe.name)
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        "debootstrap",
        "--variant=minbase",
        "--components=main",
        f"--cache-dir={cache}",
        "--include=" + ",".join(recipe.packages),
        recipe.release,
        str(target),
        debian_mirror(),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        log_file = target / "debootstrap" / "debootstrap.log"
        details = log_file.read_text()[-3000:] if log_file.exists() else result.stderr[-3000:]
        raise RuntimeError(f"debootstrap {recipe.release} failed:\n{details}")


def _post_configure(root: Path) -> None:
    for relative, content in POST_FILES.items():
        path = root / relative
        path.unlink(missing_ok=True)  # resolv.conf may be a symlink to the machine's file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    for command in POST_COMMANDS:
        subprocess.run(["chroot", str(root), "sh", "-ec", command], check=True)


# The root of the host-preparation and driver-package chroot tests: what apt, unattended-upgrades, needrestart
# and a real Debian kernel (with its initramfs) need, booted by no test host.
HOSTPREP_RELEASE = "trixie"
HOSTPREP_PACKAGES = (
    "systemd,systemd-sysv,apt,unattended-upgrades,needrestart,linux-image-cloud-amd64,initramfs-tools,kmod"
)


def hostprep_root() -> Path:
    """The cached trixie root with a kernel (built on first use, under a lock)."""
    roots = roots_dir()
    roots.mkdir(parents=True, exist_ok=True)
    root = roots / f"{HOSTPREP_RELEASE}-hostprep"
    with open(roots / f"{HOSTPREP_RELEASE}-hostprep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "usr/bin/apt-mark").exists():
            tmp = roots / f"{HOSTPREP_RELEASE}-hostprep.tmp"
            _remove_tree(tmp)
            debs = cache_dir() / "debs"
            debs.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["debootstrap", "--variant=minbase", "--components=main", f"--cache-dir={debs}",
                 f"--include={HOSTPREP_PACKAGES}", HOSTPREP_RELEASE, str(tmp), debian_mirror()],
                check=True, capture_output=True,
            )  # fmt: skip
            tmp.rename(root)
    return root


def _remove_tree(path: Path) -> None:
    """Remove ``path`` without crossing into file systems mounted below it (a killed debootstrap)."""
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


@contextmanager
def writable_copy(lower: Path, directory: Path, below: Sequence[Path] = ()) -> Iterator[Path]:
    """A writable overlay of the root ``lower``, mounted at ``directory/merged`` (its writes land in
    ``directory/upper``) and unmounted on exit; the cached root itself is never written. ``below``: layers
    under ``lower``, topmost first (``lower`` then being a layer of changes to them)."""
    merged, upper, work = (directory / sub for sub in ("merged", "upper", "work"))
    for path in (merged, upper, work):
        path.mkdir(parents=True)
    options = f"lowerdir={':'.join(map(str, (lower, *below)))},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    try:
        yield merged
    finally:
        unmounted(merged)


def unmounted(path: Path, within: float = 15) -> None:
    """``path`` unmounted, waiting up to ``within`` seconds while it is busy: a run that ended abruptly may
    leave a program in the root that ends by its own time limit (a ``timeout``-bounded read)."""
    deadline = time.monotonic() + within
    while True:
        result = subprocess.run(["umount", str(path)], capture_output=True, text=True)
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"umount {path}: {result.stderr.strip()}")
        time.sleep(0.2)


@contextmanager
def bound_file(source: Path, target: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only over the existing file ``target`` (in a root's writable copy: e.g. a
    containerd build put where the root's own binary is, without copying it), unmounted on exit."""
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


Plant = Callable[[Path], None]


@contextmanager
def planted_copies(lower: Path, directory: Path, plants: dict[str, Plant]) -> Iterator[dict[str, Path]]:
    """One ``writable_copy`` of ``lower`` per name under ``directory``, each prepared by its plant function."""
    with ExitStack() as mounts:
        copies: dict[str, Path] = {}
        for name, plant in plants.items():
            copies[name] = mounts.enter_context(writable_copy(lower, directory / name))
            plant(copies[name])
        yield copies
