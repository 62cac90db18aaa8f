"""NvmlInfo's own query against Debian's real libnvidia-ml (no GPU, no kernel module here).

pynvml loads the library in ``nvmlInit()``; NVML's version is readable once the library is loaded,
even when init then fails (a version mismatch on a node). The fact's command asks NVML only on a node
with an NVIDIA PCI device and the nvidia module loaded, so the query runs here on its own, a directory
standing for ``/sys/module/nvidia``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyinfra_gpunode.facts.nvml import NVML_SNIPPET, NvmlInfo
from tests.integration.gpu_state import DRIVER, libnvidia_ml


def test_nvml_version_is_read_after_init(tmp_path: Path) -> None:
    (tmp_path / "libnvidia-ml.so.1").symlink_to(libnvidia_ml())
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)}
    # The query asks NVML only while the module is loaded: a directory stands for /sys/module/nvidia here.
    loaded = NVML_SNIPPET.replace('"/sys/module/nvidia"', repr(str(tmp_path)))
    assert loaded != NVML_SNIPPET
    result = subprocess.run(
        ["python3", "-c", loaded], env=environment, capture_output=True, text=True, check=True, timeout=60
    )
    fact = NvmlInfo().process(result.stdout.splitlines())
    assert fact is not None, result.stderr
    assert fact["nvml_version"] == f"12.{DRIVER}", fact
    assert fact["error"] in ("DriverNotLoaded", "NoPermission", "Unknown"), fact
    assert fact["driver_version"] is None and fact["devices"] == []


def test_a_node_without_an_nvidia_pci_device_is_not_asked(tmp_path: Path) -> None:
    vendors = [path.read_text().strip() for path in Path("/sys/bus/pci/devices").glob("*/vendor")]
    if "0x10de" in vendors:
        pytest.skip("this machine has an NVIDIA PCI device")
    (tmp_path / "libnvidia-ml.so.1").symlink_to(libnvidia_ml())
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)}
    result = subprocess.run(
        ["sh", "-c", NvmlInfo().command()], env=environment, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout == "" and NvmlInfo().process([]) is None
