"""Facts about Container Device Interface (CDI) specs on a node."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import yaml
from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.cdi_checks import SPEC_DIRS, CdiSpec
from pyinfra_gpunode.memo import by_content

DEVICE_PLUGIN_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
MARKER = "@@gpunode-cdi-spec"
TOO_LARGE = "@@gpunode-cdi-spec-too-large"
NOT_UTF8 = "@@gpunode-cdi-spec-not-utf8"
# Print each spec's text, or its size where it is over the limit (shell/cdi-specs.sh).
_READ_SPECS = shell.script(Path(__file__).parent / "shell" / "cdi-specs.sh")
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


def _device_nodes(document: Any) -> list[str]:
    """Host paths of the spec's device nodes (``hostPath``, else ``path``), spec-wide then per device, once each."""
    edits = [document.get("containerEdits")]
    edits += [device.get("containerEdits") for device in document.get("devices", []) if isinstance(device, dict)]
    nodes: list[str] = []
    for edit in edits:
        found = edit.get("deviceNodes") if isinstance(edit, dict) else None
        for node in found if isinstance(found, list) else []:
            path = (node.get("hostPath") or node.get("path")) if isinstance(node, dict) else None
            if isinstance(path, str) and path not in nodes:
                nodes.append(path)
    return nodes


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


@dataclass(frozen=True)
class YamlLimits:
    """How much a CDI spec may ask of the parser: real specs are far below every limit."""

    max_bytes: int = 4 * 1024 * 1024
    max_depth: int = 64  # nested collections
    max_aliases: int = 100  # ``*name`` references (nvidia-ctk writes none)
    max_nodes: int = 1_000_000  # nodes, each alias counting the nodes it stands for
    max_seconds: float = 10.0


LIMITS = YamlLimits()


@dataclass(frozen=True)
class NodeBudget:
    """How much all of one node's CDI specs together may ask of the controller (whose one thread serves every
    node): a node has a handful of specs; past the budget the rest are errors, not parsed."""

    max_specs: int = 64
    max_bytes: int = 16 * 1024 * 1024
    max_seconds: float = 10.0


BUDGET = NodeBudget()


class SpecLimitError(yaml.YAMLError):
    """A spec asks more of the parser than ``YamlLimits`` allows."""


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, while composing, a document deeper, larger (aliases
    expanded) or slower than ``limits``, and an alias to a collection that contains it."""

    def __init__(self, stream: str, limits: YamlLimits = LIMITS) -> None:
        super().__init__(stream)
        self.limits = limits
        self.depth = 0
        self.aliases = 0
        self.nodes = 0
        self.anchor_nodes: dict[str, int] = {}  # anchor -> nodes of the collection it names, once composed
        self.deadline = time.monotonic() + limits.max_seconds

    def _refuse(self, problem: str) -> None:
        mark = self.peek_event().start_mark
        raise SpecLimitError(f"{problem} (line {mark.line + 1}, column {mark.column + 1})")

    @override
    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        limits = self.limits
        if time.monotonic() > self.deadline:
            self._refuse(f"parsing takes longer than {limits.max_seconds:g} s")
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > limits.max_aliases:
                self._refuse(f"more than {limits.max_aliases} YAML aliases")
            if event.anchor in self.anchors and event.anchor not in self.anchor_nodes:
                self._refuse(f"alias *{event.anchor[:64]} refers to a collection that contains it")
            self._count(self.anchor_nodes.get(event.anchor, 1))
            return super().compose_node(parent, index)
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if collection and self.depth >= limits.max_depth:
            self._refuse(f"collections nested deeper than {limits.max_depth} levels")
        start = self.nodes
        self._count(1)
        self.depth += collection
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= collection
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.anchor_nodes[anchor] = self.nodes - start
        return node

    def _count(self, nodes: int) -> None:
        self.nodes += nodes
        if self.nodes > self.limits.max_nodes:
            self._refuse(f"more than {self.limits.max_nodes} YAML nodes (aliases expanded)")


def _parse_key(text: str, limits: YamlLimits = LIMITS) -> tuple[str, YamlLimits]:
    """What a parse's result depends on: the text and the limits but the time (which only bounds the work)."""
    return text, replace(limits, max_seconds=0)


# A fleet's nodes carry the same specs: each text parsed once; a refusal (raised) is never kept.
@by_content(key=_parse_key)
def load_bounded(text: str, limits: YamlLimits = LIMITS) -> Any:
    """``text`` as ``yaml.safe_load`` reads it, within ``limits`` (``SpecLimitError`` naming the one exceeded)."""
    size = len(text.encode(errors="surrogateescape"))
    if size > limits.max_bytes:
        raise SpecLimitError(f"{size} bytes, more than the limit of {limits.max_bytes} bytes")
    loader = BoundedSafeLoader(text, limits)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _load(path: str, text: str, limits: YamlLimits = LIMITS) -> tuple[dict[str, Any], str | None]:
    try:
        document = load_bounded(text, limits)
    except SpecLimitError as exc:
        return {}, f"{path} is refused unparsed: {exc}"
    except yaml.YAMLError as exc:
        return {}, f"{path} is not valid YAML or JSON: {_yaml_problem(exc)}"
    if not isinstance(document, dict):
        return {}, f"{path} is not a CDI spec: its top level is not a mapping"
    devices = document.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, dict) and "name" in d for d in devices):
        return {**document, "devices": []}, f"{path} is not a CDI spec: 'devices' is not a list of named devices"
    return document, None


def parse_spec(path: str, mtime: int | None, text: str, limits: YamlLimits = LIMITS) -> CdiSpec:
    """Summarise one CDI spec (YAML or JSON): its kind, device names in file order, the driver it was made for.

    The text is parsed within ``limits`` (size, nesting, aliases, nodes, time); a spec beyond
    them is reported as an ``error`` naming the file and the limit.
    """
    document, error = _load(path, text, limits)
    return _summary(path, mtime, document, error)


def _summary(path: str, mtime: int | None, document: dict[str, Any], error: str | None) -> CdiSpec:
    versions = _driver_versions(document)
    return {
        "path": path,
        "cdi_version": _text(document.get("cdiVersion")),
        "kind": _text(document.get("kind")),
        "devices": [str(device["name"]) for device in document.get("devices", [])],
        "driver_version": versions[0] if versions else None,
        "driver_versions": versions,
        "device_nodes": _device_nodes(document),
        "device_plugin": path.rsplit("/", 1)[-1] == DEVICE_PLUGIN_SPEC,
        "mtime": mtime,
        "error": error,
    }


def spec_dirs(dirs: list[str] | None) -> list[str]:
    """The directories read: ``/etc/cdi``, ``/var/run/cdi``, then any others of ``dirs`` (containerd's
    ``cdi_spec_dirs``), each once."""
    return list(dict.fromkeys([*SPEC_DIRS, *(dirs or [])]))


class CdiSpecs(FactBase[list[CdiSpec]]):
    """
    Returns every CDI spec in ``/etc/cdi``, ``/var/run/cdi`` and the other ``dirs`` given
    (``.yaml`` and ``.json``), parsed
    as YAML (JSON is YAML) on the controller: path, ``cdiVersion``, kind, device names in file
    order, the driver version of its ``libnvidia-ml.so.<version>`` host paths (else of
    ``--host-driver-version=``; ``driver_versions``: every version it names), the host paths of
    its device nodes, whether it is the NVIDIA device plugin's own spec
    (``k8s.device-plugin.nvidia.com-gpu.json``), the modification time (epoch seconds), and
    ``error`` naming the file when it does not parse as a CDI spec. Parsing is bounded
    (``YamlLimits``: 4 MiB, collections 64 deep, 100 aliases, a million nodes with aliases
    expanded, 10 seconds); a spec beyond a limit is an ``error`` naming the file and the limit,
    and a file over 4 MiB is not read from the node at all, nor one that is not UTF-8 (named so).
    All of a node's specs together are parsed within ``NodeBudget`` (64 specs, 16 MiB, 10 seconds):
    past it, the rest are errors naming the budget.

    + dirs: further spec directories to read (containerd's ``cdi_spec_dirs``)

    .. code:: python

        [
            {
                "path": "/etc/cdi/nvidia.yaml",
                "cdi_version": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": ["0", "GPU-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2", "all"],
                "driver_version": "550.163.01",
                "driver_versions": ["550.163.01"],
                "device_nodes": ["/dev/nvidiactl", "/dev/nvidia0"],
                "device_plugin": False,
                "mtime": 1760000000,
                "error": None,
            }
        ]
    """

    @override
    def command(self, dirs: list[str] | None = None) -> str:
        return shell.command(
            _READ_SPECS, "gpunode-cdi-specs", MARKER, TOO_LARGE, str(LIMITS.max_bytes), NOT_UTF8, *spec_dirs(dirs)
        )

    @staticmethod
    def default() -> list[CdiSpec]:
        return []

    @override
    def process(self, output: list[str]) -> list[CdiSpec]:
        printed: list[tuple[str, int | None, list[str]]] = []
        for line in output:
            if line.startswith(f"{MARKER} ") or line == MARKER:
                mtime, _, path = line.removeprefix(MARKER).strip().partition(" ")
                printed.append((path, int(mtime) if mtime.isdigit() else None, []))
            elif printed:
                printed[-1][2].append(line)
        return parse_printed(printed)


def parse_printed(printed: list[tuple[str, int | None, list[str]]], budget: NodeBudget = BUDGET) -> list[CdiSpec]:
    """Each spec ``CdiSpecs``' command printed (path, mtime, body), parsed within the node's ``budget``: past
    its count, bytes or seconds the rest are errors naming the file and the budget, not parsed."""
    specs: list[CdiSpec] = []
    deadline, size = time.monotonic() + budget.max_seconds, 0
    for index, (path, mtime, body) in enumerate(printed):
        size += sum(len(line) + 1 for line in body)
        left = deadline - time.monotonic()
        over = (
            f"more than {budget.max_specs} specs" if index >= budget.max_specs
            else f"more than {budget.max_bytes} bytes of specs" if size > budget.max_bytes
            else f"more than {budget.max_seconds:g} s of parsing" if left <= 0
            else None
        )  # fmt: skip
        if over:
            error = f"{path} is refused unparsed: this node's CDI specs come to {over}, the most one node is read for"
            specs.append(_summary(path, mtime, {}, error))
            continue
        limits = YamlLimits(max_seconds=min(LIMITS.max_seconds, left))
        specs.append(_printed_spec(path, mtime, body, limits))
    return specs


def _printed_spec(path: str, mtime: int | None, body: list[str], limits: YamlLimits = LIMITS) -> CdiSpec:
    """The spec ``CdiSpecs``' command printed as ``body``: its text, the size of a file too large to read, or
    the mark of a file that is not UTF-8."""
    size = body[0].removeprefix(f"{TOO_LARGE} ") if len(body) == 1 else ""
    if body[:1] == [f"{TOO_LARGE} {size}"] and size.isdigit():
        error = f"{path} is refused unread: {size} bytes, more than the limit of {LIMITS.max_bytes} bytes"
        return _summary(path, mtime, {}, error)
    if body == [NOT_UTF8]:
        error = f"{path} is refused unread: it is not UTF-8 (CDI specs are UTF-8 YAML or JSON)"
        return _summary(path, mtime, {}, error)
    return parse_spec(path, mtime, "\n".join(body), limits)


REFRESH_SERVICE = "nvidia-cdi-refresh.service"
REFRESH_DROPIN = "/etc/systemd/system/nvidia-cdi-refresh.service.d/gpunode.conf"
# Toolkit 1.18 and 1.19 install the units in /etc/systemd/system, 1.20 in /lib/systemd/system.
UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
_READ_REFRESH = shell.script(Path(__file__).parent / "shell" / "cdi-refresh-units.sh")


class CdiRefreshInfo(TypedDict):
    """``CdiRefreshUnits``' value."""

    units: list[str]
    dropin: str | None


class CdiRefreshUnits(FactBase[CdiRefreshInfo]):
    """
    Returns where the NVIDIA Container Toolkit's CDI refresh units (``nvidia-cdi-refresh.service``
    and ``.path``, toolkit 1.18 and later) are installed, and the text of this project's drop-in
    for the service (None when absent).

    .. code:: python

        {
            "units": ["/etc/systemd/system/nvidia-cdi-refresh.service",
                      "/etc/systemd/system/nvidia-cdi-refresh.path"],
            "dropin": "[Unit]\\nStartLimitIntervalSec=0\\n",
        }
    """

    @override
    def command(self) -> str:
        return shell.command(_READ_REFRESH, "gpunode-cdi-refresh-units", REFRESH_DROPIN, *UNIT_DIRS)

    @staticmethod
    def default() -> CdiRefreshInfo:
        return {"units": [], "dropin": None}

    @override
    def process(self, output: list[str]) -> CdiRefreshInfo:
        dropin = output.index("dropin") if "dropin" in output else None
        listed = output if dropin is None else output[:dropin]  # the drop-in's own text lists no unit
        units = [line.removeprefix("unit ") for line in listed if line.startswith("unit /")]
        text = None if dropin is None else "".join(f"{line}\n" for line in output[dropin + 1 :])
        return {"units": units, "dropin": text}


def refresh_installed(info: CdiRefreshInfo) -> bool:
    """Whether the refresh service's unit is on the node (the ``.path`` unit alone does not run it)."""
    return any(unit.endswith(f"/{REFRESH_SERVICE}") for unit in info["units"])
