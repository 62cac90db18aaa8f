"""Whether every CDI spec on a node is true: for the loaded driver, with device nodes that exist, read by
the node's containerd, and which spec wins for a device defined twice (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.versions import ContainerdVersionInfo

# Where CDI specs are read from, in containerd's default order (the later wins for a device defined twice).
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# The oldest containerd that reads each cdiVersion (the CDI library it vendors); older formats are
# read by every containerd with CDI (1.7+).
CONTAINERD_FOR_CDI_VERSION: dict[tuple[int, int, int], tuple[int, int, int]] = {(0, 7, 0): (1, 7, 16)}
# Device nodes the readiness fact lists; others are not checked.
CHECKED_DEVICE_DIRS = ("/dev/nvidia", "/dev/dri/")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)\Z")


class CdiSpec(TypedDict):
    """One CDI spec as ``CdiSpecs`` returns it."""

    path: str
    cdi_version: str | None
    kind: str | None
    devices: list[str]
    driver_version: str | None
    driver_versions: list[str]
    device_nodes: list[str]
    device_plugin: bool
    mtime: int | None
    error: str | None


def missing_devices(spec: CdiSpec, gpu_count: int) -> list[str]:
    """Device names a spec must list for a node with ``gpu_count`` GPUs (each index and ``all``) but does not."""
    wanted = [str(index) for index in range(gpu_count)] + ["all"]
    return [name for name in wanted if name not in spec["devices"]]


@dataclass(frozen=True)
class SpecProblem:
    """One spec that is not true on this node: what is wrong, and what to do."""

    path: str
    problem: str
    fix: str


def _triple(text: str | None) -> tuple[int, int, int] | None:
    match = _VERSION.match(text or "")
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def containerd_needed(cdi_version: str | None) -> tuple[int, int, int] | None:
    """The oldest containerd that reads specs of ``cdi_version``, or None when every containerd with CDI does."""
    wanted = _triple(cdi_version)
    if wanted is None:
        return None
    needed = [containerd for version, containerd in CONTAINERD_FOR_CDI_VERSION.items() if wanted >= version]
    return max(needed) if needed else None


def _dotted(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


def regenerate_fix(spec: CdiSpec) -> str:
    """What makes ``spec`` true again: the device plugin rewrites its own spec when restarted, after a driver
    change (the rollout's after-hook recipe does it); other specs are generated again."""
    if spec["device_plugin"]:
        return (
            f"restart the NVIDIA device plugin pod on this node (it rewrites {spec['path']}; the after-hook "
            "recipe does it after a driver change)"
        )
    return f"regenerate it: `nvidia-ctk cdi generate --output={spec['path']}`, or remove it if nothing owns it"


def spec_problems(
    spec: CdiSpec, module: str | None, device_nodes: Sequence[str] | None, containerd: tuple[int, int, int] | None
) -> list[str]:
    """Why ``spec`` is not true on a node with driver ``module`` loaded, the device nodes ``device_nodes``
    (None: not read) and containerd at ``containerd`` (None: not installed); empty when it is."""
    if spec["error"]:
        return [spec["error"]]
    problems = []
    stale = [version for version in spec["driver_versions"] if module and not same_driver(version, module)]
    if stale:
        problems.append(f"names driver {', '.join(stale)} in its paths, but {module} is loaded")
    if device_nodes is not None:
        absent = [
            node for node in spec["device_nodes"] if node.startswith(CHECKED_DEVICE_DIRS) and node not in device_nodes
        ]
        if absent:
            problems.append(f"names device node(s) {', '.join(absent)} that do not exist")
    needed = containerd_needed(spec["cdi_version"])
    if needed is not None and containerd is not None and containerd < needed:
        problems.append(
            f"is cdiVersion {spec['cdi_version']}, which containerd {_dotted(containerd)} cannot read "
            f"(it needs containerd {_dotted(needed)} or later)"
        )
    return problems


def priority_dirs(spec_dirs: Sequence[str] | None) -> list[str]:
    """containerd's spec directories, lowest priority first (``/etc/cdi``, ``/var/run/cdi`` by default)."""
    return list(spec_dirs) if spec_dirs else list(SPEC_DIRS)


def shadowed(specs: Sequence[CdiSpec], spec_dirs: Sequence[str] | None) -> list[SpecProblem]:
    """Specs that define a device another spec defines too: the spec in a later directory of ``spec_dirs``
    wins (CDI's priority); two in the same directory conflict and CDI refuses the device."""
    order = priority_dirs(spec_dirs)
    owners: dict[str, list[CdiSpec]] = {}
    for spec in specs:
        directory = spec["path"].rsplit("/", 1)[0]
        if spec["error"] or not spec["kind"] or directory not in order:
            continue
        for device in spec["devices"]:
            owners.setdefault(f"{spec['kind']}={device}", []).append(spec)
    found: dict[str, SpecProblem] = {}
    for device, defining in owners.items():
        if len(defining) < 2:
            continue
        ranked = sorted(defining, key=lambda spec: order.index(spec["path"].rsplit("/", 1)[0]))
        winner, top = ranked[-1], order.index(ranked[-1]["path"].rsplit("/", 1)[0])
        for spec in ranked[:-1]:
            if spec["path"] in found:
                continue
            if order.index(spec["path"].rsplit("/", 1)[0]) == top:
                found[spec["path"]] = SpecProblem(
                    spec["path"],
                    f"defines {device} as {winner['path']} does, in the same directory: the device is refused",
                    f"keep one of {spec['path']} and {winner['path']}: remove the other",
                )
            else:
                found[spec["path"]] = SpecProblem(
                    spec["path"],
                    f"defines {device}, shadowed by {winner['path']} (a later directory wins)",
                    f"remove {spec['path']}: one owner of the spec per node (gpunode_cdi_owner)",
                )
    return list(found.values())


def untrue_specs(
    specs: Sequence[CdiSpec],
    module: str | None,
    device_nodes: Sequence[str] | None,
    containerd: ContainerdVersionInfo | None,
    spec_dirs: Sequence[str] | None,
) -> list[SpecProblem]:
    """Every spec that is stale (driver, device nodes, format) or shadowed, in file order, one entry each."""
    version = (containerd["major"], containerd["minor"], containerd["patch"]) if containerd else None
    problems: dict[str, SpecProblem] = {}
    for spec in specs:
        found = spec_problems(spec, module, device_nodes, version)
        if found:
            problems[spec["path"]] = SpecProblem(spec["path"], "; ".join(found), regenerate_fix(spec))
    for problem in shadowed(specs, spec_dirs):
        earlier = problems.get(problem.path)
        problems[problem.path] = (
            SpecProblem(problem.path, f"{earlier.problem}; {problem.problem}", problem.fix) if earlier else problem
        )
    return [problems[spec["path"]] for spec in specs if spec["path"] in problems]
