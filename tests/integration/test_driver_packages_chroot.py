"""The driver step with Debian's real NVIDIA packages (550.163.01, trixie non-free) in a root with a real
Debian kernel and its headers: the dry run, the install with its DKMS build, the whole set held, a second
run, a module Secure Boot would refuse, and a change to the Tesla 535 branch: built and the old driver
removed, or, its build failing, undone; and, as where the 535 module does not load after the reboot, 550 put
back over the change.

In a chroot the running kernel (``uname -r``) is this machine's, whose headers no archive offers: the node
is one mid-upgrade whose running kernel's headers have left the archive, and the module is built for the
kernel it boots next (the root's ``/vmlinuz``), the one that matters after the reboot. The install is made
once per machine and code (``tests/integration/driver_packages.py``); each test works on a writable copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.roots import hostprep_root, writable_copy
from tests.integration.driver_packages import (
    DRIVER,
    TESLA,
    cached,
    changed_layer,
    fetched,
    installed_layer,
    kernel_of,
    prepared,
    restored_layer,
    run,
    tesla_wanted,
    wanted,
)
from tests.integration.gpu_state import write

pytestmark = [
    pytest.mark.chroot,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, overlay mounts)"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="needs debootstrap"),
]
SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@pytest.fixture(scope="module")
def root() -> Path:
    return hostprep_root()


@pytest.fixture(scope="module")
def installed(root: Path) -> tuple[Path, dict[str, Any]]:
    return installed_layer(root)


@pytest.fixture
def fresh(root: Path, tmp_path: Path) -> Iterator[Path]:
    """A GPU node without a driver whose apt has the packages in its cache."""
    archive = fetched(root)
    with writable_copy(root, tmp_path) as node:
        prepared(node, archive)
        yield node


@pytest.fixture
def after_install(root: Path, installed: tuple[Path, dict[str, Any]], tmp_path: Path) -> Iterator[Path]:
    """A writable copy of the node as the driver step's install left it."""
    with writable_copy(installed[0], tmp_path, below=[root]) as node:
        yield node


def sh(root: Path, command: str) -> str:
    return subprocess.run(
        ["chroot", str(root), "sh", "-c", command], capture_output=True, text=True, check=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    ).stdout  # fmt: skip


def changes_in(upper: Path) -> list[str]:
    """Every path written in an overlay's upper layer, with its size and time; ``/tmp`` itself only by what it
    holds (a read stages its work in a temporary directory of its own there, and removes it)."""
    return sorted(
        f"{path.relative_to(upper)} {path.lstat().st_size} {path.lstat().st_mtime_ns}"
        for path in upper.rglob("*")
        if path != upper / "tmp"
    )


def running_kernel_unbuilt(root: Path) -> bool:
    """Whether this machine's kernel, the chroot's running one, is not the root's (no headers exist for it)."""
    return os.uname().release != kernel_of(root)


def test_the_dry_run_plans_the_real_packages_and_changes_nothing(fresh: Path, root: Path) -> None:
    upper = fresh.parent / "upper"
    before = changes_in(upper)
    status, log = run(fresh, "--dry")
    assert status == 0, log
    kernel = kernel_of(root)
    assert f"plan: install {' '.join(sorted(wanted(root)))}; hold as one: " in log  # what the test fetched
    assert "; hold as one: firmware-nvidia-gsp, libcuda1, linux-headers-" in log
    if running_kernel_unbuilt(root):
        assert f"DKMS builds the nvidia {DRIVER} module for kernel {kernel} only" in log
    assert changes_in(upper) == before  # dpkg's status, holds, apt's cache, modules: nothing written


def test_the_install_builds_the_module_for_the_boot_kernel_and_holds_the_whole_set(
    installed: tuple[Path, dict[str, Any]], after_install: Path, root: Path
) -> None:
    status, log = installed[1]["status"], installed[1]["log"]
    assert status == 0, log
    kernel = kernel_of(root)
    node = after_install
    assert (node / f"lib/modules/{kernel}/updates/dkms/nvidia-current.ko.xz").is_file()
    assert sh(node, f"modinfo -k {kernel} -F version nvidia-current").strip() == DRIVER
    assert sh(node, f"modinfo -k {kernel} -F vermagic nvidia-current").split()[0] == kernel
    assert sh(node, "dpkg --audit") == ""  # nothing half-installed
    held = set(sh(node, "apt-mark showhold").split())
    of_the_driver = {
        line.split()[0]
        for line in sh(node, "dpkg-query -W -f='${Package} ${Version}\\n'").splitlines()
        if line.split()[1].startswith(f"{DRIVER}-")
    }
    assert {"nvidia-driver", "nvidia-kernel-dkms", "firmware-nvidia-gsp", f"linux-headers-{kernel}"} <= held
    # only recommended by nvidia-driver: named, so that persistence mode can be turned on, and held with the set
    assert "nvidia-persistenced" in held and (node / "usr/lib/systemd/system/nvidia-persistenced.service").exists()
    assert {"libnvidia-ml1", "libcuda1", "nvidia-kernel-support"} <= of_the_driver <= held, of_the_driver - held


def test_a_second_run_changes_nothing(after_install: Path) -> None:
    upper = after_install.parent / "upper"
    status, log = run(after_install)
    assert status == 0, log
    assert "] No changes" in log, log
    assert changes_in(upper) == []


def test_secure_boot_refuses_the_unsigned_module_dkms_built(after_install: Path) -> None:
    """Debian's DKMS signs only with a key it makes with openssl, which the node lacks: the module is
    unsigned, and with Secure Boot on (the key declared enrolled) the step fails the node naming it."""
    write(after_install, "/" + SECURE_BOOT, "\x06\x00\x00\x00\x01")
    status, log = run(after_install, data={"mok_enrolled": True})
    assert status != 0
    assert f"the nvidia {DRIVER} module DKMS built for kernel" in log and "is not signed, and Secure Boot is on" in log


def driver_packages(node: Path) -> dict[str, str]:
    """Installed driver packages (names with ``nvidia`` or ``libcuda``), name -> version."""
    listed = sh(node, "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' '*nvidia*' 'libcuda*'")
    return {line.split()[1]: line.split()[2] for line in listed.splitlines() if line[1:2] == "i"}


def test_a_branch_change_whose_build_fails_puts_the_previous_driver_back(after_install: Path, root: Path) -> None:
    """550 to the Tesla 535 branch, whose DKMS build fails (DKMS's own per-module override runs ``false`` as its
    build): the node fails naming the build log, and is left as it was: the 550 packages at their versions and
    held, no 535 package, nothing half-installed, the 550 module in place."""
    node = after_install
    cached(node, fetched(node, tesla_wanted(root)))
    write(node, "/etc/dkms/nvidia-tesla-535.conf", 'MAKE[0]="false"\n')
    before, held = driver_packages(node), sh(node, "apt-mark showhold")
    status, log = run(node, data={"driver_version": TESLA})
    assert status != 0, log
    assert f"DKMS build log /var/lib/dkms/nvidia-tesla-535/{TESLA}/build/make.log, its last lines:" in log, log
    assert f"the install of driver {TESLA} failed: driver {DRIVER} is back, its packages held again" in log
    assert sh(node, "dpkg --audit") == ""
    after = driver_packages(node)
    assert not [name for name in after if "tesla" in name], after
    assert {name: version for name, version in after.items() if version.startswith(f"{DRIVER}-")} == {
        name: version for name, version in before.items() if version.startswith(f"{DRIVER}-")
    }
    assert set(held.split()) <= set(sh(node, "apt-mark showhold").split())
    kernel = kernel_of(root)
    assert sh(node, f"modinfo -k {kernel} -F version nvidia-current").strip() == DRIVER


@pytest.fixture(scope="module")
def changed(root: Path) -> tuple[Path, dict[str, Any]]:
    return changed_layer(root)


@pytest.fixture
def after_change(root: Path, installed: tuple[Path, dict[str, Any]], changed: tuple[Path, dict[str, Any]],
                 tmp_path: Path) -> Iterator[Path]:  # fmt: skip
    """A writable copy of the node as the change to the Tesla 535 branch left it."""
    with writable_copy(changed[0], tmp_path, below=[installed[0], root]) as node:
        yield node


def test_a_branch_change_installs_the_new_driver_then_removes_the_old(
    changed: tuple[Path, dict[str, Any]], after_change: Path, root: Path
) -> None:
    """550 to the Tesla 535 branch: 535 installed, built and held as one; then 550's packages apt no longer
    needs removed, its module with them: no second driver tree for Debian's alternatives to keep loading."""
    status, log = changed[1]["status"], changed[1]["log"]
    assert status == 0, log
    node, kernel = after_change, kernel_of(root)
    assert sh(node, "dpkg --audit") == ""
    after = driver_packages(node)
    assert {"nvidia-tesla-535-driver", "nvidia-tesla-535-kernel-dkms", "libnvidia-tesla-535-cuda1"} <= set(after)
    left = {name for name, version in after.items() if version.startswith(f"{DRIVER}-")}
    assert not left & {"nvidia-driver", "nvidia-kernel-dkms", "libcuda1", "libnvidia-ml1", "nvidia-smi"}, left
    assert not (node / f"lib/modules/{kernel}/updates/dkms/nvidia-current.ko.xz").exists()
    of_tesla = {name for name, version in after.items() if version.startswith(f"{TESLA}-")}
    assert of_tesla <= set(sh(node, "apt-mark showhold").split())
    # nvidia-persistenced kept through the change, on the branch's own libnvidia-cfg1: no 550 library left with it
    assert "nvidia-persistenced" in after and "libnvidia-tesla-535-cfg1" in after and "libnvidia-cfg1" not in after
    # `modprobe nvidia` loads what Debian's alternatives name: now the 535 module
    assert "install nvidia modprobe -i nvidia-tesla-535 " in sh(node, "cat /etc/modprobe.d/nvidia.conf")
    assert sh(node, f"modinfo -k {kernel} -F version nvidia-tesla-535").strip() == TESLA
    status, log = run(node, data={"driver_version": TESLA})
    assert status == 0 and "] No changes" in log, log


def test_putting_the_replaced_driver_back_after_a_change_reinstalls_and_holds_it(
    root: Path, installed: tuple[Path, dict[str, Any]], changed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """What the step runs where the Tesla 535 module does not load after the reboot: 550's packages (the install
    removed them) installed again from apt's cache at their versions and built, 535's removed, 550 held, and
    Debian's alternatives naming the 550 module again."""
    back, record = restored_layer(root)
    assert record["status"] == 0, record["log"]
    assert f"driver {TESLA} did not load: driver {DRIVER} is back, its packages held again" in record["log"]
    with writable_copy(back, tmp_path, below=[changed[0], installed[0], root]) as node:
        kernel = kernel_of(root)
        assert sh(node, "dpkg --audit") == ""
        after = driver_packages(node)
        assert not [name for name in after if "tesla" in name], after
        with writable_copy(installed[0], tmp_path / "installed", below=[root]) as before_change:
            before = {name: v for name, v in driver_packages(before_change).items() if v.startswith(f"{DRIVER}-")}
        assert {name: version for name, version in after.items() if version.startswith(f"{DRIVER}-")} == before
        assert set(before) <= set(sh(node, "apt-mark showhold").split())
        assert "nvidia-persistenced" in after and "libnvidia-tesla-535-cfg1" not in after
        assert "install nvidia modprobe -i nvidia-current " in sh(node, "cat /etc/modprobe.d/nvidia.conf")
        assert sh(node, f"modinfo -k {kernel} -F version nvidia-current").strip() == DRIVER
        status, log = run(node)
        assert status == 0 and "] No changes" in log, log
