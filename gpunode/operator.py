"""The NVIDIA GPU Operator beside this project: who owns each layer of a GPU node (no I/O).

The operator's toolkit container (GPU Operator 25.10 and later, nvidia-ctk-installer) installs its
binaries under ``/usr/local/nvidia/toolkit``, writes the nvidia runtime into
``/etc/containerd/conf.d/99-nvidia.toml`` and restarts containerd with SIGHUP; its driver container
puts the driver's root at ``/run/nvidia/driver``; its validator leaves markers in
``/run/nvidia/validations``. The input is what ``pyinfra_gpunode.facts.operator.GpuOperatorState``
returns, with the containerd config files ``ContainerdConfigFiles`` read. Nothing read from the
node is trusted: a file that does not parse defines no runtime.
"""

from __future__ import annotations

import posixpath
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyinfra_gpunode import node_toml
from pyinfra_gpunode.containerd_dropin import CRI_V2, CRI_V3_RUNTIME, OUR_DROPIN, RUNTIME
from pyinfra_gpunode.driver_versions import version_from_library
from pyinfra_gpunode.k0s import DROPIN as K0S_DROPIN
from pyinfra_gpunode.platform import GENERATED, NAMES

TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
OPERATOR_DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
DRIVER_ROOT = "/run/nvidia/driver"
VALIDATIONS_DIR = "/run/nvidia/validations"
TOOLKIT_OFF = "toolkit.enabled=false"
DRIVER_OFF = "driver.enabled=false"
TAKE_OVER_KEY = "gpunode_take_over_runtime"

GPUNODE, OPERATOR, USER = "gpunode", "GPU Operator toolkit", "user"


@dataclass(frozen=True)
class RuntimeWriter:
    """A config file that defines a runtime, the ``BinaryName`` it gives it, and who wrote it."""

    path: str
    binary: str | None
    writer: str  # GPUNODE, OPERATOR, USER, or the platform that generates the file (k3s, RKE2, k0s)

    def describe(self) -> str:
        return f"{self.path} ({self.writer}, BinaryName {self.binary or 'unset'})"


def under_toolkit_dir(binary: str | None) -> bool:
    """Whether ``binary`` lies in the operator's toolkit directory (normalised: no ``..`` escape)."""
    return bool(binary) and posixpath.normpath(str(binary)).startswith(TOOLKIT_DIR + "/")


def defined_runtime(text: str, name: str) -> tuple[bool, str | None]:
    """``(defines, BinaryName)`` of runtime ``name`` in a containerd config file's ``text``
    (CRI plugin of config version 2 or 3); a file that does not parse defines nothing."""
    try:
        data = node_toml.loads(text)
    except tomllib.TOMLDecodeError:
        return False, None
    plugins = data.get("plugins")
    if not isinstance(plugins, dict):
        return False, None
    for plugin in (CRI_V2, CRI_V3_RUNTIME):
        table = plugins.get(plugin)
        containerd = table.get("containerd") if isinstance(table, dict) else None
        runtimes = containerd.get("runtimes") if isinstance(containerd, dict) else None
        runtime = runtimes.get(name) if isinstance(runtimes, dict) else None
        if isinstance(runtime, dict):
            options = runtime.get("options")
            binary = options.get("BinaryName") if isinstance(options, dict) else None
            return True, binary if isinstance(binary, str) else None
    return False, None


def writer_of(path: str, binary: str | None, toolkit_installed: bool, platform: str | None = None) -> str:
    """Who wrote a file defining the nvidia runtime: this project's drop-in (``/etc/containerd`` or k0s'); the
    operator's toolkit (a BinaryName under its directory, or its drop-in path while its binaries are
    installed; ``nvidia-ctk runtime configure`` writes the same path for a toolkit on the host); the platform
    that owns containerd (``ContainerdPlatformInfo``'s ``name``) for the config it generates; else a user."""
    if path in (OUR_DROPIN, K0S_DROPIN):
        return GPUNODE
    if under_toolkit_dir(binary) or (path == OPERATOR_DROPIN and toolkit_installed):
        return OPERATOR
    if platform in GENERATED and path == GENERATED[platform]:
        return NAMES[platform]
    return USER


def runtime_writers(
    texts: Mapping[str, str],
    name: str = RUNTIME,
    operator: Mapping[str, Any] | None = None,
    platform: str | None = None,
) -> list[RuntimeWriter]:
    """Every file of ``texts`` (path -> text, in load order) that defines runtime ``name``;
    ``operator``: the ``GpuOperatorState`` fact (whether its toolkit binaries are installed); ``platform``:
    the platform that owns containerd, if any (its generated config is its own)."""
    installed = bool(operator and operator.get("toolkit_binaries"))
    writers = []
    for path, text in texts.items():
        defines, binary = defined_runtime(text, name)
        if defines:
            writers.append(RuntimeWriter(path, binary, writer_of(path, binary, installed, platform)))
    return writers


def config_texts(files: Mapping[str, Any], operator: Mapping[str, Any]) -> dict[str, str]:
    """The texts of containerd's loaded config files in load order, then the operator's drop-in
    when containerd does not load it yet (this project's ``imports`` would make it load)."""
    order = [file for file in [files.get("main"), *files.get("imported", [])] if file]
    texts = {file["path"]: file["text"] for file in order if file.get("text")}
    if operator.get("dropin") is not None and OPERATOR_DROPIN not in texts:
        texts[OPERATOR_DROPIN] = operator["dropin"]
    return texts


def operator_runtime(writers: list[RuntimeWriter], operator: Mapping[str, Any]) -> RuntimeWriter | None:
    """The operator's definition of the nvidia runtime when its toolkit manages it on this node:
    a file whose BinaryName lies under ``/usr/local/nvidia/toolkit``, or its drop-in defining the
    runtime while its binaries are installed there; else None."""
    installed = bool(operator.get("toolkit_binaries"))
    for writer in writers:
        if under_toolkit_dir(writer.binary) or (writer.path == OPERATOR_DROPIN and installed):
            return writer
    return None


def runtime_refusal(found: RuntimeWriter) -> str:
    """Why the deploy does not write its own nvidia runtime beside the operator's, and what to do."""
    return (
        f"the GPU Operator's toolkit manages the nvidia runtime on this node: {found.describe()}; "
        f"two writers of one runtime fight over it (the operator rewrites its drop-in and restarts "
        f"containerd with SIGHUP). Hand the runtime to gpunode with `{TOOLKIT_OFF}` in the operator's Helm "
        f"values, or set host data {TAKE_OVER_KEY}: true to load gpunode's runtime after the operator's"
    )


def take_over_note(found: RuntimeWriter) -> str:
    """What the plan says when host data tells the deploy to take the runtime over."""
    return (
        f"{TAKE_OVER_KEY}: gpunode's nvidia runtime ({OUR_DROPIN}) loads after the GPU Operator's "
        f"{found.describe()}, which is left in place; set `{TOOLKIT_OFF}` in the operator's Helm values "
        "so it stops rewriting it"
    )


def driver_owner(driver: Mapping[str, Any], operator: Mapping[str, Any], packages: Mapping[str, Any]) -> str:
    """Who provides the driver: the operator's driver container, host packages, or a preinstalled driver."""
    if driver_from_container(driver, operator):
        return f"GPU Operator driver container ({DRIVER_ROOT})"
    if driver.get("library_package"):
        return f"host packages ({driver['library_package']})"
    if driver.get("library"):
        return f"preinstalled ({driver['library']}, no package)"
    if any("nvidia" in name for name in packages):
        return "host packages"
    return "none"


def driver_from_container(driver: Mapping[str, Any], operator: Mapping[str, Any]) -> bool:
    """A loaded module whose userspace is in the operator's driver root, not on the host."""
    return bool(driver.get("loaded") and not driver.get("library") and operator.get("driver_root_library"))


def container_userspace(operator: Mapping[str, Any]) -> str | None:
    """The driver version of the libnvidia-ml in the operator's driver root (from its file name)."""
    library = operator.get("driver_root_library")
    return version_from_library(library) if isinstance(library, str) else None


def toolkit_owner(toolkit: Mapping[str, Any], operator: Mapping[str, Any]) -> str:
    """Who provides the container toolkit: host packages, binaries outside dpkg, the operator's toolkit."""
    owners = []
    if toolkit.get("packages"):
        owners.append("host packages (" + ", ".join(sorted(toolkit["packages"])) + ")")
    elif toolkit.get("ctk_path") or toolkit.get("runtime_binary"):
        where = toolkit.get("runtime_binary") or toolkit.get("ctk_path")
        owners.append(f"binaries outside dpkg ({where})")
    if operator.get("toolkit_binaries"):
        owners.append(f"{OPERATOR} ({TOOLKIT_DIR})")
    return " and ".join(owners) or "none"


def owners_text(
    driver: str, toolkit: str, writers: list[RuntimeWriter], validations: list[str] | None, name: str = RUNTIME
) -> str:
    """One line naming each layer's owner."""
    runtime = "; ".join(writer.describe() for writer in writers) or "no file"
    markers = "not run" if validations is None else (", ".join(validations) or "none")
    return f"driver: {driver}; toolkit: {toolkit}; runtime {name}: {runtime}; validations: {markers}"


def handler_problem(runtimes: Mapping[str, Mapping[str, Any]], handler: str, binary: str) -> str | None:
    """Why containerd's runtimes (a dump summary's) do not serve the RuntimeClass ``handler`` with
    the toolkit's ``binary``, or None."""
    runtime = runtimes.get(handler)
    if runtime is None:
        return (
            f"the RuntimeClass handler {handler} (gpunode_runtime_handler) names no runtime in containerd's config "
            f"(runtimes: {', '.join(runtimes) or 'none'}): gpunode registers runtime nvidia; set "
            f"gpunode_runtime_handler: nvidia, or define runtime {handler} in a drop-in"
        )
    found = runtime.get("BinaryName")
    if found != binary:
        return (
            f"the RuntimeClass handler {handler} (gpunode_runtime_handler) runs {found or 'runc (no BinaryName)'}, "
            f"not the toolkit's {binary}: its pods would get no GPU"
        )
    return None
