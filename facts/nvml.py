"""Facts about what NVML (through pynvml on the node) reports of the driver and the GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import NotRequired, TypedDict, cast

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from typing_extensions import override

from pyinfra_gpunode import node_json, shell
from pyinfra_gpunode.gpu_queries import NVML_SECONDS


class NvmlDevice(TypedDict):
    index: int
    name: str
    uuid: str
    memory_total: int
    persistence_mode: NotRequired[bool | None]  # None: NVML did not say (answers before it was asked lack it)


class NvmlInfoDict(TypedDict):
    """``NvmlInfo``'s value (None without pynvml on the node)."""

    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: str | None
    devices: list[NvmlDevice]
    error: str | None


NVML_SNIPPET = """
import json
import os
try:
    import pynvml
except Exception:
    raise SystemExit(0)
def text(value):
    return value.decode() if isinstance(value, bytes) else value
out = {"driver_version": None, "nvml_version": None, "cuda_driver_version": None, "devices": [], "error": None}
if not os.path.isdir("/sys/module/nvidia"):  # nvmlInit would load the module (nvidia-modprobe)
    out["error"] = "DriverNotLoaded"
    print(json.dumps(out))
    raise SystemExit(0)
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    out["error"] = type(exc).__name__.replace("NVMLError_", "")
try:
    out["nvml_version"] = text(pynvml.nvmlSystemGetNVMLVersion())
except Exception:
    pass
if out["error"]:
    print(json.dumps(out))
    raise SystemExit(0)
try:
    out["driver_version"] = text(pynvml.nvmlSystemGetDriverVersion())
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
    out["cuda_driver_version"] = "%d.%d" % (cuda // 1000, cuda % 1000 // 10)
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            persistence = pynvml.nvmlDeviceGetPersistenceMode(handle) == pynvml.NVML_FEATURE_ENABLED
        except pynvml.NVMLError:
            persistence = None
        out["devices"].append({"index": index, "name": text(pynvml.nvmlDeviceGetName(handle)),
                               "uuid": text(pynvml.nvmlDeviceGetUUID(handle)), "memory_total": memory.total,
                               "persistence_mode": persistence})
except pynvml.NVMLError as exc:
    out["error"] = type(exc).__name__.replace("NVMLError_", "")
finally:
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass
print(json.dumps(out))
"""


# NVML asked through the snippet where the node has an NVIDIA PCI device and python3, bounded in time
# (shell/nvml.sh): ``{"error": "Timeout", ...}`` where it does not answer.
NVML_PROGRAM = Path(__file__).parent / "shell" / "nvml.sh"
NVML_COMMAND = shell.command(shell.script(NVML_PROGRAM), "gpunode-nvml", str(NVML_SECONDS), NVML_SNIPPET)


class NvmlInfo(FactBase[NvmlInfoDict | None]):
    """
    Returns what NVML reports through pynvml (``nvidia-ml-py``) when ``python3`` on the node
    can import it: driver, NVML and CUDA driver versions and the devices, or the NVML error
    name (e.g. ``LibRmVersionMismatch``, ``DriverNotLoaded``; ``Timeout`` where it did not answer within
    ``NVML_SECONDS``: a wedged GPU). NVML is asked only while the
    nvidia module is loaded (``/sys/module/nvidia``), since initialising it may load the module:
    otherwise the error is ``DriverNotLoaded``. None without pynvml, and on a node without an
    NVIDIA PCI device (not asked).

    .. code:: python

        {
            "driver_version": "550.163.01",
            "nvml_version": "12.550.163.01",
            "cuda_driver_version": "12.4",
            "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                         "uuid": "GPU-bc5610b9-...", "memory_total": 85520809984}],
            "error": None,
        }
    """

    @override
    def command(self) -> str:
        return NVML_COMMAND

    @staticmethod
    def default() -> None:
        return None

    @override
    def process(self, output: list[str]) -> NvmlInfoDict | None:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            value = node_json.loads(text.splitlines()[-1])
        except ValueError as exc:
            raise FactProcessError(f"NVML query printed no JSON: {exc}") from exc
        return cast(NvmlInfoDict, value) if isinstance(value, dict) else None
