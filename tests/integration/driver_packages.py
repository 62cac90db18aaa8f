"""Debian's real NVIDIA driver packages for the host-preparation root, and that root with them installed by
the driver step.

The packages (``nvidia-driver`` 550.163.01 from trixie's non-free component, with ``nvidia-kernel-dkms``,
``firmware-nvidia-gsp``, ``libcuda1``, ``nvidia-smi`` and the root's kernel headers, and everything they pull
in) are fetched once per
machine with a private apt configuration (this machine's apt setup is left alone) into the cache, with the
package lists they were resolved from. A node is prepared with those lists and files, so that its own apt
installs without reaching any archive: as after ``driver_downloaded``.

The install builds the module with DKMS (about two minutes on two cores), so the root as the driver step
left it is kept in the cache: the overlay layer of its changes and the run's log, under a stamp naming the
packages, the root and every source file of the project. Any change to the code installs again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests import cli
from tests.fleet.archive import debian_mirror
from tests.fleet.paths import cache_dir, roots_dir
from tests.fleet.roots import HOSTPREP_RELEASE, _remove_tree, writable_copy
from tests.integration.gpu_state import plant_gpu

REPO = Path(__file__).resolve().parents[2]
DRIVER = "550.163.01"
PACKAGE_VERSION = f"{DRIVER}-2"
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


def fetched(root: Path) -> Path:
    """A directory with ``sources.list``, apt's ``lists`` for it and, in ``cache/archives``, every file an
    install of the driver into ``root`` needs; fetched once per machine (under a lock)."""
    scratch = cache_dir() / "nvidia" / f"archive-{HOSTPREP_RELEASE}"
    scratch.mkdir(parents=True, exist_ok=True)
    sources = f"deb [signed-by={KEYRING}] {debian_mirror()} {HOSTPREP_RELEASE} {COMPONENTS}\n"
    status = hashlib.sha256((root / "var/lib/dpkg/status").read_bytes()).hexdigest()
    stamp = json.dumps({"sources": sources, "packages": wanted(root), "status": status})
    with open(scratch.parent / f".archive-{HOSTPREP_RELEASE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (scratch / "stamp").exists() and (scratch / "stamp").read_text() == stamp:
            return scratch
        for sub in ("lists/partial", "cache/archives/partial"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        (scratch / "sources.list").write_text(sources)
        (scratch / "stamp").unlink(missing_ok=True)
        apt = _apt(scratch, root)
        subprocess.run([*apt, "update"], check=True)
        subprocess.run([*apt, "install", "--download-only", "-y", "--no-install-recommends", *wanted(root)], check=True)
        (scratch / "stamp").write_text(stamp)
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
    archives = node / "var/cache/apt/archives"
    for deb in (archive / "cache/archives").glob("*.deb"):
        try:
            os.link(deb, archives / deb.name)
        except OSError:
            shutil.copy2(deb, archives / deb.name)
    plant_gpu(node / "sys/bus/pci/devices")


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
    base = roots_dir() / f"{HOSTPREP_RELEASE}-hostprep-driver-{DRIVER}"
    stamp = json.dumps({"archive": (archive / "stamp").read_text(), "root": str(root), "code": _code_hash()})
    with open(roots_dir() / f".{base.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (base / "stamp").exists() and (base / "stamp").read_text() == stamp:
            return base / "layer", json.loads((base / "run.json").read_text())
        _remove_tree(base)
        building = base.with_name(base.name + ".tmp")
        _remove_tree(building)
        building.mkdir(parents=True)
        with writable_copy(root, building) as node:
            prepared(node, archive)
            status, log = run(node)
        (building / "upper").rename(building / "layer")
        _remove_tree(building / "work")
        (building / "run.json").write_text(json.dumps({"status": status, "log": log}))
        (building / "stamp").write_text(stamp)
        building.rename(base)
        return base / "layer", json.loads((base / "run.json").read_text())
