"""A flat apt repository of small test packages standing for Debian's driver packages (``nvidia-driver``,
``firmware-nvidia-gsp``, ``libcuda1``, ``nvidia-smi``, ``nvidia-kernel-dkms``, ``nvidia-persistenced`` and a
kernel's headers), built here with ``dpkg-deb`` and read by a node's apt through the ``copy:`` method.

The module package of each version can ship a module for the kernel: an object file whose ``.modinfo`` says
what DKMS's build would (``modinfo`` reads it; no kernel can load it), or a real module built elsewhere
(``modules``), indexed by ``depmod`` when installed and removed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

DRIVER = "550.163.01"
DRIVER_PACKAGES = ("firmware-nvidia-gsp", "libcuda1", "nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi")
# as in Debian's contrib: one nvidia-persistenced, at the newest driver's version, for every driver
PERSISTENCED_VERSION = f"{DRIVER}-1"


def build_repository(
    directory: Path,
    kernel: str,
    versions: tuple[str, ...] = (f"{DRIVER}-2",),
    modules: bool | Mapping[str, Path] = False,
    load_at_boot: bool = False,
) -> Path:
    """A flat apt repository (``Packages`` beside the ``.deb`` files) of the test driver packages, at each of
    ``versions``; with ``modules`` the module package of each ships a module for ``kernel``: a stand-in
    object file, or (a mapping, package version -> file) the module built for it. ``load_at_boot``: the module
    package names ``nvidia`` in ``/etc/modules-load.d``, as udev loads it on a node with a GPU."""
    packages = [(name, version) for version in versions for name in DRIVER_PACKAGES]
    packages += [(f"linux-headers-{kernel}", "1"), ("nvidia-persistenced", PERSISTENCED_VERSION)]
    repository = directory / "repository"
    repository.mkdir(parents=True)
    for name, version in packages:
        tree = directory / "trees" / f"{name}_{version}"
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
            "Maintainer: pyinfra-gpunode tests <tests@example.invalid>\nDescription: test package\n"
        )
        (tree / "usr/share/doc" / name).mkdir(parents=True)
        (tree / "usr/share/doc" / name / "test-package").write_text(f"{name} {version}\n")
        if name == "nvidia-kernel-dkms" and modules:
            built = modules.get(version) if isinstance(modules, Mapping) else None
            stand_in_module(tree, kernel, version.rsplit("-", 1)[0], built)
            if load_at_boot:
                (tree / "etc/modules-load.d").mkdir(parents=True)
                (tree / "etc/modules-load.d/nvidia.conf").write_text("nvidia\n")
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-b", str(tree), str(repository / f"{name}_{version}_amd64.deb")],
            check=True, capture_output=True,
        )  # fmt: skip
    index = subprocess.run(
        ["dpkg-scanpackages", "-m", ".", "/dev/null"], cwd=repository, check=True, capture_output=True, text=True
    )
    (repository / "Packages").write_text(index.stdout)
    return repository


def stand_in_module(tree: Path, kernel: str, version: str, built: Path | None = None) -> None:
    """``/lib/modules/KERNEL/updates/dkms/nvidia.ko`` in package tree ``tree``: ``built``, or an object file
    whose ``.modinfo`` says what DKMS's build would (version, vermagic); indexed by ``depmod`` when installed
    and removed."""
    module_dir = tree / "lib/modules" / kernel / "updates/dkms"
    module_dir.mkdir(parents=True)
    for script in ("postinst", "postrm"):
        (tree / "DEBIAN" / script).write_text(f"#!/bin/sh\ndepmod {kernel}\n")
        (tree / "DEBIAN" / script).chmod(0o755)
    if built is not None:
        (module_dir / "nvidia.ko").write_bytes(built.read_bytes())
        return
    work = tree.parent / f"{tree.name}.build"
    work.mkdir()
    info = work / "modinfo"
    info.write_bytes(
        f"version={version}\0vermagic={kernel} SMP preempt mod_unload modversions \0name=nvidia\0".encode()
    )
    subprocess.run(["as", "-o", str(work / "empty.o"), "/dev/null"], check=True)
    subprocess.run(
        ["objcopy", f"--add-section=.modinfo={info}", "--set-section-flags=.modinfo=alloc,readonly",
         str(work / "empty.o"), str(module_dir / "nvidia.ko")],
        check=True,
    )  # fmt: skip
