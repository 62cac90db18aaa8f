"""Facts about Container Device Interface (CDI) specs on a node."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, TypedDict

import yaml
from pyinfra.api import FactBase
from typing_extensions import override

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
DEVICE_PLUGIN_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
MARKER = "@@gpunode-cdi-spec"
_ML = re.compile(r"libnvidia-ml\.so\.(\d+(?:\.\d+)+)")
_HOST_DRIVER = re.compile(r"--host-driver-version=(\d+(?:\.\d+)+)")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _driver_versions(document: Any) -> list[str]:
    """Driver versions of the ``libnvidia-ml.so.<version>`` paths, then of ``--host-driver-version=``."""
    versions: list[str] = []
    for rx in (_ML, _HOST_DRIVER):
        for text in _strings(document):
            for found in rx.findall(text):
                if found not in versions:
                    versions.append(found)
    return versions


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def _load(path: str, text: str) -> tuple[dict[str, Any], str | None]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return {}, f"{path} is not valid YAML or JSON: {_yaml_problem(exc)}"
    if not isinstance(document, dict):
        return {}, f"{path} is not a CDI spec: its top level is not a mapping"
    devices = document.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, dict) and "name" in d for d in devices):
        return {**document, "devices": []}, f"{path} is not a CDI spec: 'devices' is not a list of named devices"
    return document, None


class CdiSpec(TypedDict):
    """One CDI spec as ``CdiSpecs`` returns it."""

    path: str
    cdi_version: str | None
    kind: str | None
    devices: list[str]
    driver_version: str | None
    driver_versions: list[str]
    device_plugin: bool
    mtime: int | None
    error: str | None


def parse_spec(path: str, mtime: int | None, text: str) -> CdiSpec:
    """Summarise one CDI spec (YAML or JSON): its kind, device names in file order, the driver it was made for."""
    document, error = _load(path, text)
    versions = _driver_versions(document)
    return {
        "path": path,
        "cdi_version": _text(document.get("cdiVersion")),
        "kind": _text(document.get("kind")),
        "devices": [str(device["name"]) for device in document.get("devices", [])],
        "driver_version": versions[0] if versions else None,
        "driver_versions": versions,
        "device_plugin": path.rsplit("/", 1)[-1] == DEVICE_PLUGIN_SPEC,
        "mtime": mtime,
        "error": error,
    }


def missing_devices(spec: CdiSpec, gpu_count: int) -> list[str]:
    """Device names a spec must list for a node with ``gpu_count`` GPUs (each index and ``all``) but does not."""
    wanted = [str(index) for index in range(gpu_count)] + ["all"]
    return [name for name in wanted if name not in spec["devices"]]


class CdiSpecs(FactBase[list[CdiSpec]]):
    """
    Returns every CDI spec in ``/etc/cdi`` and ``/var/run/cdi`` (``.yaml`` and ``.json``), parsed
    as YAML (JSON is YAML) on the controller: path, ``cdiVersion``, kind, device names in file
    order, the driver version of its ``libnvidia-ml.so.<version>`` host paths (else of
    ``--host-driver-version=``), whether it is the NVIDIA device plugin's own spec
    (``k8s.device-plugin.nvidia.com-gpu.json``), the modification time (epoch seconds), and
    ``error`` naming the file when it does not parse as a CDI spec.

    .. code:: python

        [
            {
                "path": "/etc/cdi/nvidia.yaml",
                "cdi_version": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": ["0", "GPU-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2", "all"],
                "driver_version": "550.163.01",
                "driver_versions": ["550.163.01"],
                "device_plugin": False,
                "mtime": 1760000000,
                "error": None,
            }
        ]
    """

    @override
    def command(self) -> str:
        dirs = " ".join(f"{d}/*.yaml {d}/*.json" for d in SPEC_DIRS)
        return (
            f"for spec in {dirs}; do "
            f'if [ -f "$spec" ]; then echo "{MARKER} $(stat -c %Y "$spec") $spec"; cat "$spec"; echo; fi; done'
        )

    @staticmethod
    def default() -> list[CdiSpec]:
        return []

    @override
    def process(self, output: list[str]) -> list[CdiSpec]:
        specs: list[CdiSpec] = []
        current: tuple[str, int | None] | None = None
        body: list[str] = []
        for line in [*output, MARKER]:
            if line.startswith(f"{MARKER} ") or line == MARKER:
                if current is not None:
                    specs.append(parse_spec(current[0], current[1], "\n".join(body)))
                mtime, _, path = line.removeprefix(MARKER).strip().partition(" ")
                current, body = (path, int(mtime) if mtime.isdigit() else None), []
                continue
            body.append(line)
        return specs
