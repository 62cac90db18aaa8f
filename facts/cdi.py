"""Facts about Container Device Interface (CDI) specs on a node."""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
_ML = re.compile(r"libnvidia-ml\.so\.(\d+(?:\.\d+)+)")
_HOST_DRIVER = re.compile(r"--host-driver-version=(\d+(?:\.\d+)+)")
_KIND = re.compile(r"""^kind:\s*["']?([^"'\s]+)""")
_NAME = re.compile(r"""^\s*-\s*name:\s*["']?([^"'\s]+?)["']?\s*$""")


def parse_spec(path: str, mtime: int | None, lines: list[str]) -> dict[str, Any]:
    """Summarise one CDI spec: kind, device names, the driver version its host paths belong to."""
    kind = None
    devices: list[str] = []
    versions: list[str] = []
    in_devices = False
    for line in lines:
        match = _KIND.match(line)
        if match:
            kind = match.group(1)
        if re.match(r"^devices:", line):
            in_devices = True
            continue
        if in_devices and re.match(r"^\S", line):
            in_devices = False
        if in_devices:
            match = _NAME.match(line)
            if match and len(line) - len(line.lstrip()) <= 6:
                devices.append(match.group(1))
        for rx in (_ML, _HOST_DRIVER):
            for found in rx.findall(line):
                if found not in versions:
                    versions.append(found)
    return {
        "path": path,
        "kind": kind,
        "devices": devices,
        "driver_version": versions[0] if versions else None,
        "driver_versions": versions,
        "mtime": mtime,
    }


class CdiSpecs(FactBase[list[dict[str, Any]]]):
    """
    Returns every CDI spec in ``/etc/cdi`` and ``/var/run/cdi`` (``.yaml`` and ``.json``):
    path, kind, device names, the driver version of its ``libnvidia-ml.so.<version>`` host
    paths (or ``--host-driver-version``), and the modification time (epoch seconds).

    .. code:: python

        [
            {
                "path": "/var/run/cdi/nvidia.yaml",
                "kind": "nvidia.com/gpu",
                "devices": ["0", "GPU-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2", "all"],
                "driver_version": "550.163.01",
                "driver_versions": ["550.163.01"],
                "mtime": 1760000000,
            }
        ]
    """

    @override
    def command(self) -> str:
        dirs = " ".join(f"{d}/*.yaml {d}/*.json" for d in SPEC_DIRS)
        return (
            f"for spec in {dirs}; do "
            'if [ -f "$spec" ]; then echo "@@spec $spec $(stat -c %Y "$spec")"; cat "$spec"; echo; fi; done'
        )

    @staticmethod
    def default() -> list[dict[str, Any]]:
        return []

    @override
    def process(self, output: list[str]) -> list[dict[str, Any]]:
        specs: list[dict[str, Any]] = []
        current: tuple[str, int | None] | None = None
        body: list[str] = []
        for line in [*output, "@@spec"]:
            if line.startswith("@@spec"):
                if current is not None:
                    specs.append(parse_spec(current[0], current[1], body))
                parts = line.split()
                if len(parts) >= 2:
                    mtime = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
                    current, body = (parts[1], mtime), []
                continue
            body.append(line)
        return specs
