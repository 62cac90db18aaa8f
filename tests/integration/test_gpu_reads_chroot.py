"""The GPU facts' real commands on a Debian trixie root (``chroot``): reading changes nothing on the node.

apt's package index is read without writing its binary caches, and nothing that may load the nvidia
module (``nvidia-smi``, NVML's ``nvmlInit``, both of which can run ``nvidia-modprobe``) runs while
``/sys/module/nvidia`` is absent; nor does Python write bytecode for what the NVML query imports.
Stand-ins for ``nvidia-smi`` and ``pynvml`` planted in the root record each call, so the tests see
whether a read asked them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.facts.driver import NvidiaDriver, NvidiaHostState
from pyinfra_gpunode.facts.nvml import NvmlInfo
from pyinfra_gpunode.facts.package_index import NvidiaAptVersions
from tests.fleet.roots import writable_copy
from tests.integration.gpu_state import DRIVER, plant_gpu, plant_module, write

pytestmark = pytest.mark.chroot

SMI_CALLS = "/tmp/nvidia-smi.calls"
NVML_CALLS = "/tmp/nvml-init.calls"
FAKE_SMI = f"""#!/bin/sh
echo "$*" >> {SMI_CALLS}
echo {DRIVER}
"""
FAKE_PYNVML = f'''
class NVMLError(Exception):
    pass


def nvmlInit():
    with open("{NVML_CALLS}", "a") as calls:
        calls.write("nvmlInit\\n")


def nvmlShutdown():
    pass


def nvmlSystemGetNVMLVersion():
    return "12.{DRIVER}"


def nvmlSystemGetDriverVersion():
    return "{DRIVER}"


def nvmlSystemGetCudaDriverVersion():
    return 12040


def nvmlDeviceGetCount():
    return 0
'''


@pytest.fixture
def root(trixie_root: Path, tmp_path: Path) -> Iterator[Path]:
    with writable_copy(trixie_root, tmp_path / "node") as merged:
        yield merged


def read(root: Path, command: str, path: str | None = None) -> list[str]:
    """A fact command's output lines, run in the root as pyinfra's ``@chroot`` runs it (with ``PATH`` ``path``
    where given)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}  # as on a node
    if path is not None:
        env["PATH"] = path
    chroot = shutil.which("chroot") or "chroot"  # found on this machine's PATH, not the node's
    done = subprocess.run([chroot, str(root), "sh", "-c", command], capture_output=True, text=True, check=True, env=env)
    return done.stdout.splitlines()


def digest(root: Path, *paths: str) -> str:
    """One hash over the names, modes, owners and contents of every file under ``paths`` in the root."""
    listing = " ".join(paths)
    return subprocess.run(
        ["chroot", str(root), "sh", "-c",
         f"find {listing} -xdev -printf '%p %m %u %g %s\\n' | sort; "
         f"find {listing} -xdev -type f -print0 | sort -z | xargs -0 sha256sum"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_apt_versions_read_writes_no_apt_cache(root: Path) -> None:
    for stale in (root / "var/cache/apt").glob("*.bin"):
        stale.unlink()  # absent or outdated caches are what apt-cache rebuilds and writes
    before = digest(root, "/var/cache", "/var/lib")
    fact = NvidiaAptVersions()
    versions = fact.process(read(root, fact.command(["bash", "nvidia-driver"])))
    assert versions.get("bash"), f"the package index was not read: {versions}"
    assert digest(root, "/var/cache", "/var/lib") == before
    assert not list((root / "var/cache/apt").glob("*.bin"))


def test_driver_read_asks_nvidia_smi_only_with_the_module_loaded(root: Path) -> None:
    plant_gpu(root / "sys/bus/pci/devices")
    write(root, "/usr/local/bin/nvidia-smi", FAKE_SMI, mode=0o755)
    fact = NvidiaDriver()
    driver = fact.process(read(root, fact.command()))
    assert not (root / SMI_CALLS.lstrip("/")).exists(), "nvidia-smi ran without the nvidia module loaded"
    assert not driver["loaded"] and not driver["nvidia_smi_ok"]

    plant_module(root / "sys/module", root / "proc/driver")  # the same read once the module is loaded
    driver = fact.process(read(root, fact.command()))
    assert (root / SMI_CALLS.lstrip("/")).exists()
    assert driver["loaded"] and driver["nvidia_smi_ok"] and driver["kernel_module_version"] == DRIVER


def test_nvml_read_initialises_nvml_only_with_the_module_loaded(root: Path) -> None:
    plant_gpu(root / "sys/bus/pci/devices")
    write(root, "/usr/local/lib/python3.13/dist-packages/pynvml.py", FAKE_PYNVML)
    fact = NvmlInfo()
    nvml = fact.process(read(root, fact.command()))
    assert not (root / NVML_CALLS.lstrip("/")).exists(), "nvmlInit ran without the nvidia module loaded"
    assert nvml is not None and nvml["error"] == "DriverNotLoaded" and nvml["driver_version"] is None

    plant_module(root / "sys/module", root / "proc/driver")
    nvml = fact.process(read(root, fact.command()))
    assert (root / NVML_CALLS.lstrip("/")).exists()
    assert nvml is not None and nvml["error"] is None and nvml["driver_version"] == DRIVER
    assert not list(root.glob("usr/local/lib/python3.13/dist-packages/__pycache__/pynvml*")), "the read wrote bytecode"


def plant_built_module(root: Path, version: str) -> None:
    """A DKMS-built ``nvidia.ko`` of driver ``version`` for the running kernel (only its ``.modinfo``
    section, which is what ``modinfo`` reads), registered with ``depmod`` as DKMS does."""
    kernel = os.uname().release
    folder = root / "lib/modules" / kernel / "updates/dkms"
    folder.mkdir(parents=True)
    (root / "tmp/modinfo").write_bytes(f"version={version}\0license=NVIDIA\0name=nvidia\0".encode())
    subprocess.run(
        ["objcopy", "-I", "binary", "-O", "elf64-x86-64", "-B", "i386:x86-64", "--rename-section",
         ".data=.modinfo", str(root / "tmp/modinfo"), str(folder / "nvidia.ko")],
        check=True,
    )  # fmt: skip
    subprocess.run(["chroot", str(root), "depmod", kernel], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs objcopy (binutils)")
def test_host_state_reads_the_version_of_the_module_built_for_the_running_kernel(root: Path) -> None:
    fact = NvidiaHostState()
    state = fact.process(read(root, fact.command()))
    assert state["built_module_version"] is None and not state["module_built"]

    plant_built_module(root, "550.127.05")  # a module left from another driver version
    state = fact.process(read(root, fact.command()))
    assert state["module_built"] and state["built_module_version"] == "550.127.05"
    # A login without /sbin and /usr/sbin on PATH (modinfo and ldconfig live there): the read finds them.
    assert fact.process(read(root, fact.command(), path=USER_PATH)) == state


USER_PATH = "/usr/local/bin:/usr/bin:/bin"
