"""Facts about the NVIDIA GPU Operator's files on a node: its toolkit, driver container and validator."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.operator import DRIVER_ROOT, OPERATOR_DROPIN, TOOLKIT_DIR, VALIDATIONS_DIR

MARK = "@@gpunode-operator:"
LIMIT = 65536  # bytes read of the drop-in and of the driver-ready marker
PARTS = ("toolkit", "driver_root", "validations", "driver_ready", "dropin")
# Print the operator's toolkit binaries, driver root library, validator markers and drop-in (shell/gpu-operator.sh).
_READ = shell.script(Path(__file__).parent / "shell" / "gpu-operator.sh")


class GpuOperatorInfo(TypedDict):
    """``GpuOperatorState``'s value."""

    toolkit_binaries: list[str]
    driver_root_library: str | None
    validations: list[str] | None
    driver_ready: dict[str, str]
    dropin: str | None


def parse_operator(output: list[str]) -> GpuOperatorInfo:
    """The parts of ``gpu-operator.sh``'s output; the drop-in's text is everything after its marker."""
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output:
        name = line[len(MARK) :] if line.startswith(MARK) else None
        if "dropin" not in parts and name in PARTS and name not in parts:
            current = parts.setdefault(name, [])
        elif current is not None:
            current.append(line)
    libraries = [line.strip() for line in parts.get("driver_root", []) if line.strip().startswith(DRIVER_ROOT + "/")]
    ready = dict(line.strip().partition("=")[::2] for line in parts.get("driver_ready", []) if "=" in line)
    dropin, markers = parts.get("dropin"), parts.get("validations")
    return {
        "toolkit_binaries": sorted({line.strip() for line in parts.get("toolkit", []) if line.strip()}),
        "driver_root_library": libraries[0] if libraries else None,
        "validations": None if markers is None else sorted({line.strip() for line in markers if line.strip()}),
        "driver_ready": ready,
        "dropin": None if dropin is None else "\n".join(dropin) + "\n",
    }


class GpuOperatorState(FactBase[GpuOperatorInfo]):
    """
    Returns what the NVIDIA GPU Operator left on the node: the executables of its toolkit
    container in ``/usr/local/nvidia/toolkit``, the versioned ``libnvidia-ml.so.*`` of its driver
    container's root ``/run/nvidia/driver`` (regular files only, no link followed; None without
    one), its validator's markers in ``/run/nvidia/validations`` (None when it has not run) with
    the ``driver-ready`` marker's ``KEY=VALUE`` lines, and the text of its toolkit's containerd
    drop-in ``/etc/containerd/conf.d/99-nvidia.toml`` (None without it; at most 64 KiB of each).

    .. code:: python

        {
            "toolkit_binaries": ["nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-ctk"],
            "driver_root_library": "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
            "validations": ["driver-ready", "toolkit-ready"],
            "driver_ready": {"IS_HOST_DRIVER": "false", "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"},
            "dropin": "version = 3\\n[plugins]\\n...",
        }
    """

    @override
    def command(self) -> str:
        return shell.command(
            _READ, "gpunode-gpu-operator", MARK, TOOLKIT_DIR, DRIVER_ROOT, VALIDATIONS_DIR, OPERATOR_DROPIN, str(LIMIT)
        )

    @staticmethod
    def default() -> GpuOperatorInfo:
        return parse_operator([])

    @override
    def process(self, output: list[str]) -> GpuOperatorInfo:
        return parse_operator(output)
