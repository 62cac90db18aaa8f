"""Debian's real NVIDIA driver packages for the host-preparation root, and that root with them installed by
the driver step.

The packages (``nvidia-driver`` 550.163.01 from trixie's non-free component, with ``nvidia-kernel-dkms``,
``firmware-nvidia-gsp``, ``libcuda1``, ``nvidia-smi`` and the root's kernel headers, and everything they pull
in; then the Tesla 535 branch's) are fetched once per machine with a private apt configuration (this
machine's apt setup is left alone) into the cache, with the package lists they were resolved from. A node is
prepared with those lists and files, so that its own apt installs without reaching any archive: as after
``driver_downloaded``.

The install builds the module with DKMS (about two minutes on two cores), and so do the change to the
Tesla 535 branch over it and putting 550 back over that: the root as each step left it is kept in the
cache, the overlay layer of its changes and the run's log, under a stamp naming the packages, the layers
below and every source file of the project. Any change to the code installs again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra_gpunode.driver_plan import previous_set
from pyinfra_gpunode.operations._packages import restore_built
from tests import cli
from tests.fleet.archive import debian_mirror
from tests.fleet.paths import cache_dir, roots_dir
from tests.fleet.roots import HOSTPREP_RELEASE, _remove_tree, writable_copy
from tests.integration.gpu_state import plant_gpu

REPO = Path(__file__).resolve().parents[2]
DRIVER = "550.163.01"
PACKAGE_VERSION = f"{DRIVER}-2"
PERSISTENCED_VERSION = "550.163.01-1"  # contrib's nvidia-persistenced, both trees' (its own version)
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
COMPONENTS = "main contrib non-free non-free-firmware"
# What the project's code is: a change to any of these installs again.
SOURCES = ("operations", "facts", "gpunode", "deploys", "pyproject.toml", "tests/integration/driver_packages.py")
DEPLOY = """\
from pyinfra import host

from pyinfra_gpunode.operations import driver

driver.driver(
    name="NVIDIA driver from Debian's packages",
    version=host.data.driver_version,
    allow_dkms=True,
    mok_enrolled=host.data.get("mok_enrolled", False),
)
"""
TESLA = "535.274.02"  # Debian 13's nvidia-tesla-535 branch, the branch change's target
TESLA_VERSION = f"{TESLA}-1~deb13u1"


def tesla_wanted(root: Path) -> list[str]:
    """What the driver step installs for branch 535 (as its plan names the packages)."""
    names = ("nvidia-tesla-535-driver", "libnvidia-tesla-535-cuda1", "nvidia-tesla-535-smi",
             "libnvidia-tesla-535-cfg1", "nvidia-tesla-535-kernel-dkms")  # fmt: skip
    return [
        *(f"{name}={TESLA_VERSION}" for name in names),
        f"nvidia-persistenced={PERSISTENCED_VERSION}",
        f"linux-headers-{kernel_of(root)}",
    ]


def archive_stamp(root: Path) -> str:
    """What the driver's packages for ``root`` were fetched from."""
    return json.dumps([(cache_dir() / "nvidia" / f"archive-{HOSTPREP_RELEASE}" / "sources.list").read_text(),
                       wanted(root)])  # fmt: skip


def kernel_of(root: Path) -> str:
    """The release of the kernel the root boots (its ``/vmlinuz`` link)."""
    return os.readlink(root / "vmlinuz").rsplit("vmlinuz-", 1)[-1]


def wanted(root: Path) -> list[str]:
    """What the driver step installs into ``root`` (as its plan names them)."""
    return [
        f"nvidia-driver={PACKAGE_VERSION}",
        f"firmware-nvidia-gsp={PACKAGE_VERSION}",
        f"libcuda1={PACKAGE_VERSION}",
        f"nvidia-smi={PACKAGE_VERSION}",
        f"nvidia-kernel-dkms={PACKAGE_VERSION}",
        f"nvidia-persistenced={PERSISTENCED_VERSION}",
        f"linux-headers-{kernel_of(root)}",
    ]


def _apt(scratch: Path, root: Path) -> list[str]:
    return [
        "apt-get",
        f"-oDir::Etc::SourceList={scratch / 'sources.list'}",
        "-oDir::Etc::SourceParts=-",
        f"-oDir::State::Lists={scratch / 'lists'}",
        f"-oDir::Cache={scratch / 'cache'}",
        f"-oDir::State::status={root / 'var/lib/dpkg/status'}",
        "-oAPT::Architecture=amd64",
        "-oAPT::Sandbox::User=root",
        "-qq",
    ]


def fetched(root: Path, packages: list[str] | None = None) -> Path:
    """A directory with ``sources.list``, apt's ``lists`` for it and, in ``cache/archives``, every file an
    install of ``packages`` (default: the driver, ``wanted``) into ``root`` (its dpkg status) needs; the lists
    fetched once per machine and sources, the files once per packages and status (under a lock)."""
    packages = wanted(root) if packages is None else packages
    scratch = cache_dir() / "nvidia" / f"archive-{HOSTPREP_RELEASE}"
    scratch.mkdir(parents=True, exist_ok=True)
    sources = f"deb [signed-by={KEYRING}] {debian_mirror()} {HOSTPREP_RELEASE} {COMPONENTS}\n"
    status = hashlib.sha256((root / "var/lib/dpkg/status").read_bytes()).hexdigest()
    done = scratch / "fetched" / hashlib.sha256(json.dumps([sources, packages, status]).encode()).hexdigest()
    with open(scratch.parent / f".archive-{HOSTPREP_RELEASE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return scratch
        apt = _apt(scratch, root)
        for sub in ("lists/partial", "cache/archives/partial", "fetched"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        if not (scratch / "sources.list").exists() or (scratch / "sources.list").read_text() != sources:
            for old in (scratch / "fetched").iterdir():
                old.unlink()
            (scratch / "sources.list").write_text(sources)
            subprocess.run([*apt, "update"], check=True)
        subprocess.run([*apt, "install", "--download-only", "-y", "--no-install-recommends", *packages], check=True)
        done.touch()
    return scratch


def prepared(node: Path, archive: Path) -> None:
    """A writable copy of the root made a GPU node whose apt offers the driver from ``archive`` with every
    file in its cache: the lists replace its own, the files are linked (copied across file systems)."""
    (node / "etc/apt/sources.list").write_text((archive / "sources.list").read_text())
    lists = node / "var/lib/apt/lists"
    for old in lists.iterdir():
        if old.is_file() and old.name != "lock":
            old.unlink()
    for new in (archive / "lists").iterdir():
        if new.is_file() and new.name != "lock":
            shutil.copy2(new, lists / new.name)
    cached(node, archive)
    plant_gpu(node / "sys/bus/pci/devices")


def cached(node: Path, archive: Path) -> None:
    """Every file of ``archive`` in the node's apt cache (linked; copied across file systems)."""
    archives = node / "var/cache/apt/archives"
    for deb in (archive / "cache/archives").glob("*.deb"):
        if not (archives / deb.name).exists():
            try:
                os.link(deb, archives / deb.name)
            except OSError:
                shutil.copy2(deb, archives / deb.name)


def run(node: Path, *args: str, data: dict[str, Any] | None = None) -> tuple[int, str]:
    """The driver step through pyinfra's CLI on ``node`` (``@chroot``): its exit status and log."""
    deploy = node.parent / "driver_deploy.py"
    deploy.write_text(DEPLOY)
    settings = {"driver_version": DRIVER, **(data or {})}
    options = [part for key, value in settings.items() for part in ("--data", f"{key}={value}")]
    confirm = [] if "--dry" in args else ["-y"]
    done = cli.pyinfra(*confirm, *options, *args, f"@chroot/{node}", deploy, cwd=node.parent, timeout=1200)
    return done.returncode, done.stdout


def _code_hash() -> str:
    digest = hashlib.sha256()
    for source in SOURCES:
        path = REPO / source
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def installed_layer(root: Path) -> tuple[Path, dict[str, Any]]:
    """The changes the driver step made installing the driver into a prepared copy of ``root`` (an overlay
    layer to lay over it) and its run's record (``status``, ``log``); made once per packages, root and code
    (under a lock), kept in the cache."""
    archive = fetched(root)

    def install(node: Path) -> tuple[int, str]:
        prepared(node, archive)
        return run(node)

    stamp = json.dumps({"archive": archive_stamp(root), "root": str(root), "code": _code_hash()})
    return _layer(f"{HOSTPREP_RELEASE}-hostprep-driver-{DRIVER}", stamp, [root], install)


def changed_layer(root: Path) -> tuple[Path, dict[str, Any]]:
    """The changes the driver step made changing the installed node (``installed_layer``) to the Tesla 535
    branch, a layer over that one's, and its run's record; made once per install and code, kept in the cache."""
    installed, _ = installed_layer(root)

    def change(node: Path) -> tuple[int, str]:
        cached(node, fetched(node, tesla_wanted(root)))
        return run(node, data={"driver_version": TESLA})

    stamp = json.dumps({"below": (installed.parent / "stamp").read_text(), "packages": tesla_wanted(root)})
    return _layer(f"{HOSTPREP_RELEASE}-hostprep-driver-{TESLA}", stamp, [installed, root], change)


def restored_layer(root: Path) -> tuple[Path, dict[str, Any]]:
    """The changes putting driver 550 back made on the changed node (``changed_layer``), as the driver step does
    where the Tesla 535 module does not load after its reboot (``_packages.restore_built`` with the packages
    the install left: ``previous_set``), a layer over that one's, and its record; made once per change and code."""
    installed, _ = installed_layer(root)
    changed, _ = changed_layer(root)
    previous = previous_set(dpkg_status(installed / "var/lib/dpkg/status"), DRIVER)

    def restore(node: Path) -> tuple[int, str]:
        command = str(restore_built(previous, DRIVER, TESLA))
        done = subprocess.run(
            ["chroot", str(node), "/bin/sh", "-c", command], capture_output=True, text=True, timeout=1200,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    stamp = json.dumps({"below": (changed.parent / "stamp").read_text(), "previous": previous})
    return _layer(f"{HOSTPREP_RELEASE}-hostprep-driver-{DRIVER}-back", stamp, [changed, installed, root], restore)


def dpkg_status(path: Path) -> dict[str, dict[str, Any]]:
    """The installed packages a dpkg status file lists, as ``NvidiaHostState`` gives them: name -> version."""
    packages: dict[str, dict[str, Any]] = {}
    for stanza in path.read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status", "").endswith(" installed"):
            packages[fields["Package"]] = {"version": fields["Version"], "held": fields["Status"].startswith("hold")}
    return packages


Build = Callable[[Path], tuple[int, str]]  # writes a layer on a node: the run's exit status and log


def _layer(name: str, stamp: str, lowers: list[Path], build: Build) -> tuple[Path, dict[str, Any]]:
    """The overlay layer ``build`` writes on a writable copy of ``lowers`` (topmost first) and its record, kept in
    the cache under ``name`` while its stamp is ``stamp`` (built under a lock otherwise)."""
    base = roots_dir() / name
    with open(roots_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (base / "stamp").exists() and (base / "stamp").read_text() == stamp:
            return base / "layer", json.loads((base / "run.json").read_text())
        _remove_tree(base)
        building = base.with_name(base.name + ".tmp")
        _remove_tree(building)
        building.mkdir(parents=True)
        with writable_copy(lowers[0], building, below=lowers[1:]) as node:
            status, log = build(node)
        (building / "upper").rename(building / "layer")
        _remove_tree(building / "work")
        (building / "run.json").write_text(json.dumps({"status": status, "log": log}))
        (building / "stamp").write_text(stamp)
        building.rename(base)
        return base / "layer", json.loads((base / "run.json").read_text())
