"""A driver change rebooted into on the qemu host (a real Debian kernel): the new module does not load, and the
step puts the old driver back and reboots into it.

The driver's packages are small test packages (``driver_repository``) whose module package ships a real kernel
module named ``nvidia``, built here for the VM's kernel (in the root the real driver was installed into, which
has that kernel's headers and a compiler) and loaded at boot by ``systemd-modules-load``: the old version's
loads; the new version's refuses to, as NVIDIA's does on a machine without its GPU (its init returns
``-ENODEV``). The GPU itself is planted on the PCI bus the facts read, at every boot, as the fleet tests plant
it. No DKMS build runs in the VM: under emulation it would take most of an hour.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.fleet.paths import cache_dir
from tests.fleet.roots import hostprep_root, writable_copy
from tests.integration.driver_packages import installed_layer, kernel_of
from tests.integration.driver_repository import DRIVER_PACKAGES, PERSISTENCED_VERSION, build_repository
from tests.integration.gpu_state import boot_unit

pytestmark = pytest.mark.vm

NODE = "vm1"
OLD, NEW = "550.144.03", "550.163.01"
OLD_PACKAGE, NEW_PACKAGE = f"{OLD}-1", f"{NEW}-2"
REPOSITORY = "/srv/gpunode-test-repo"
PLANTED = "/root/gpunode-planted"
MODULE_SOURCE = """\
#include <linux/module.h>
#include <linux/init.h>
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("test stand-in for NVIDIA's module: loads, or refuses to as without a GPU");
MODULE_VERSION(STAND_IN_VERSION);
static int __init stand_in_init(void) { return STAND_IN_LOADS ? 0 : -ENODEV; }
static void __exit stand_in_exit(void) {}
module_init(stand_in_init);
module_exit(stand_in_exit);
"""
# At every boot, before SSH: the GPU on the PCI bus the facts read; and a line for the boot: its id, the nvidia
# module loaded then (systemd-modules-load loaded it, or tried), and where none is, why the kernel refuses it.
BOOT_SCRIPT = f"""mount --bind {PLANTED}/pci /sys/bus/pci/devices
loaded=$(cat /sys/module/nvidia/version 2>/dev/null || echo none)
refused=-
[ "$loaded" != none ] || refused=$(modprobe nvidia 2>&1 | grep -c "could not insert 'nvidia': No such device")
echo "$(cat /proc/sys/kernel/random/boot_id) $loaded $refused" >> {PLANTED}/boots
"""
BOOT_UNIT = boot_unit("test: an NVIDIA GPU on the PCI bus", f"{PLANTED}/boot.sh", after="systemd-modules-load.service")
DEPLOY = """\
from pyinfra_gpunode.operations import driver

driver.driver(name="NVIDIA driver", version={version!r}, flavor="default", allow_dkms=True, reboot=True,
              reboot_timeout=900)
"""


def stand_in_modules(root: Path, work: Path) -> dict[str, Path]:
    """Package version -> the ``nvidia`` module built for the kernel of ``root``: OLD's loads, NEW's refuses to;
    built once per machine and source, kept in the cache."""
    kernel = kernel_of(root)
    stamp = hashlib.sha256((kernel + MODULE_SOURCE).encode()).hexdigest()[:16]
    kept = cache_dir() / "stand-in-modules" / f"{kernel}-{stamp}"
    wanted = {OLD_PACKAGE: (OLD, 1), NEW_PACKAGE: (NEW, 0)}
    if not all((kept / f"{version}.ko").is_file() for version in wanted):
        layer, _ = installed_layer(root)  # the driver's real install: the kernel's headers and a compiler
        with writable_copy(layer, work, below=[root]) as node:
            for package, (version, loads) in wanted.items():
                source = node / "tmp/stand-in" / package
                source.mkdir(parents=True)
                (source / "nvidia.c").write_text(MODULE_SOURCE)
                (source / "Kbuild").write_text(
                    f"obj-m := nvidia.o\nccflags-y := -DSTAND_IN_VERSION='\"{version}\"' -DSTAND_IN_LOADS={loads}\n"
                )
                subprocess.run(
                    ["chroot", str(node), "make", "-s", "-C", f"/usr/src/linux-headers-{kernel}",
                     f"M=/tmp/stand-in/{package}", "modules"],
                    check=True, capture_output=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                )  # fmt: skip
                kept.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / "nvidia.ko", kept / f"{package}.ko.tmp")
                (kept / f"{package}.ko.tmp").rename(kept / f"{package}.ko")
    return {package: kept / f"{package}.ko" for package in wanted}


def sh(fleet: Any, command: str, timeout: float = 300) -> str:
    result = fleet.run(NODE, command, timeout=timeout)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return str(result.stdout)


def put(fleet: Any, path: str, data: bytes) -> None:
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), NODE, f"mkdir -p $(dirname {path}) && cat > {path}"],
        input=data, capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def test_a_driver_change_whose_module_the_kernel_refuses_is_put_back_and_rebooted_into(
    vm_fleet: Any, tmp_path: Path
) -> None:
    fleet = vm_fleet
    # A fresh disk costs a reboot, minutes under emulation: taken only where a run before left this test's marks
    # (the host-preparation test before it leaves a kernel hold and apt settings, which change nothing here).
    if fleet.run(NODE, f"dpkg-query -W 'nvidia*' 2>/dev/null; ls -d {PLANTED} 2>/dev/null").stdout.strip():
        fleet.reset([NODE])
    root = hostprep_root()
    kernel = sh(fleet, "uname -r").strip()
    assert kernel == kernel_of(root), "the VM boots another kernel than the modules are built for"
    modules = stand_in_modules(root, tmp_path / "build-root")
    repository = build_repository(
        tmp_path / "build", kernel, (OLD_PACKAGE, NEW_PACKAGE), modules=modules, load_at_boot=True
    )
    tar = subprocess.run(["tar", "-C", str(repository), "-c", "."], check=True, capture_output=True).stdout
    put(fleet, "/root/repository.tar", tar)
    pci = f"{PLANTED}/pci/0000:41:00.0"
    old_set = {**{name: OLD_PACKAGE for name in DRIVER_PACKAGES}, "nvidia-persistenced": PERSISTENCED_VERSION}
    old_pins = " ".join(f"{name}={version}" for name, version in sorted(old_set.items()))
    put(fleet, "/etc/systemd/system/gpunode-test-gpu.service", BOOT_UNIT.encode())
    put(fleet, f"{PLANTED}/boot.sh", BOOT_SCRIPT.encode())
    sh(fleet, textwrap.dedent(f"""\
        set -e
        mkdir -p {REPOSITORY} {pci} && tar -C {REPOSITORY} -xf /root/repository.tar
        echo 0x10de > {pci}/vendor && echo 0x030200 > {pci}/class && echo 0x2331 > {pci}/device
        echo 'deb [trusted=yes] copy:{REPOSITORY} ./' > /etc/apt/sources.list.d/gpunode-test.list
        apt-get update -qq -o Dir::Etc::sourcelist=/etc/apt/sources.list.d/gpunode-test.list \\
            -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {old_pins} >/dev/null
        apt-mark hold {' '.join(old_set)} >/dev/null
        systemctl enable -q gpunode-test-gpu.service
        modprobe nvidia && mount --bind {PLANTED}/pci /sys/bus/pci/devices
        cat /sys/module/nvidia/version
    """))  # fmt: skip
    boot = sh(fleet, "cat /proc/sys/kernel/random/boot_id").strip()
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY.format(version=NEW))
    inventory = tmp_path / "inventory.py"
    hosts = f"runpy.run_path({str(fleet.inventory_path)!r})['hosts']"
    inventory.write_text(f"import runpy\nhosts = [host for host in {hosts} if host[0] == {NODE!r}]\n")

    run = cli.pyinfra("-y", inventory, deploy, timeout=2400)
    assert run.returncode != 0, run.stdout
    assert (
        f"after the reboot the loaded NVIDIA module is none (userspace none), not {NEW}; driver {OLD} put back: it "
        "is loaded, its packages held"
    ) in run.stdout, run.stdout
    # two boots: into the new driver, whose module the kernel refuses ("No such device"), then into the old
    # one again, loaded
    boots = [line.split() for line in sh(fleet, f"cat {PLANTED}/boots").splitlines()]
    assert [(loaded, refused) for _, loaded, refused in boots] == [("none", "1"), (OLD, "-")], boots
    assert boot not in {boot_id for boot_id, _, _ in boots}
    assert sh(fleet, "cat /sys/module/nvidia/version").strip() == OLD
    status = sh(fleet, "dpkg-query -W -f='${Package} ${Status} ${Version}\\n' " + " ".join(old_set))
    wanted = [f"{name} hold ok installed {version}" for name, version in sorted(old_set.items())]
    assert sorted(status.splitlines()) == wanted, status
    assert sh(fleet, "dpkg --audit") == ""
