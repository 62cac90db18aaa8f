"""k3s and RKE2 nodes: host data the agent does not apply, as a drop-in in its ``config-v3.toml.d`` (no I/O).

What the agent does, as its sources have it (k3s-io/k3s ``pkg/agent/templates``; RKE2 runs the same agent
as program ``rke2``): at every start it writes ``/var/lib/rancher/<program>/agent/etc/containerd/config.toml``
afresh, adding the nvidia runtimes it finds. Releases on containerd 2.x render the version-3 template,
whose first keys are ``version = 3`` and ``imports = ["/var/lib/rancher/<program>/agent/etc/containerd/
config-v3.toml.d/*.toml"]``; containerd 2.x deep-merges imported files, so a small drop-in there changes
only the keys it sets, and survives the agent's rewrite of config.toml. Releases on containerd 1.x render
version 2 and import nothing; and containerd 1.7 would replace the whole CRI section with the last file's
anyway: no drop-in is written there (``platform.rancher_unapplied`` refuses the node, naming the agent's
ways).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

import tomlkit

from pyinfra_gpunode import node_toml
from pyinfra_gpunode.containerd_dropin import CRI_V3_RUNTIME, NRI, flatten
from pyinfra_gpunode.platform import NAMES, ContainerdPlatformInfo, rancher_config
from pyinfra_gpunode.versions import ContainerdVersionInfo

DROPIN_NAME = "90-gpunode-nvidia.toml"
BACKUP_NAME = "rancher-containerd"  # backups: <BACKUP_DIR>/rancher-containerd-<time>.tar
# The host-data keys a drop-in applies; a binary other than the one the agent finds is not among them.
DROPIN_KEYS = (
    "gpunode_runtime_handler", "gpunode_nvidia_systemd_cgroup", "gpunode_nvidia_default_runtime",
    "gpunode_enable_cdi", "gpunode_cdi_spec_dirs", "gpunode_containerd_mode", "gpunode_enable_nri",
)  # fmt: skip
HEADER = (
    "# Written by pyinfra-gpunode: what host data asks beyond the nvidia runtime {label} adds itself.\n"
    "# {label} rewrites config.toml at every start and imports this directory; containerd merges this file.\n"
)


def etc_dir(program: str) -> str:
    """The directory of the agent's generated containerd config."""
    return rancher_config(program).rsplit("/", 1)[0]


def dropin_dir(program: str) -> str:
    """The drop-in directory the agent's version-3 config imports."""
    return f"{etc_dir(program)}/config-v3.toml.d"


def dropin_path(program: str) -> str:
    """gpunode's drop-in on a k3s or RKE2 node."""
    return f"{dropin_dir(program)}/{DROPIN_NAME}"


def bin_dir(program: str) -> str:
    """Where the agent unpacks its containerd and ctr (before PATH)."""
    return f"/var/lib/rancher/{program}/data/current/bin"


def layout_problem(version: ContainerdVersionInfo | None, generated: str | None, program: str) -> str | None:
    """Why no drop-in applies on this node, or ``None``: the agent's containerd is 2.x and its generated
    config (``generated``) is version 3, importing ``config-v3.toml.d/*.toml``."""
    config = rancher_config(program)
    if version is None:
        return f"the agent's containerd was not found (in {bin_dir(program)}/ or on PATH)"
    if version["major"] < 2:
        return f"containerd {version['raw']} replaces the whole CRI section with the last file's (no safe drop-in)"
    if generated is None:
        return f"{config} is missing"
    try:
        data = node_toml.loads(generated)
    except tomllib.TOMLDecodeError as error:
        return f"{config} is not TOML: {error}"
    imports = data.get("imports")
    wanted = f"{dropin_dir(program)}/*.toml"
    if data.get("version") != 3 or not isinstance(imports, list) or wanted not in imports:
        return f"{config} is not version 3 importing {wanted}"
    return None


def appliable(requests: Mapping[str, object], info: ContainerdPlatformInfo) -> bool:
    """Whether a drop-in applies every request: no binary other than the one the agent finds."""
    binary = requests.get("gpunode_nvidia_runtime_binary")
    return binary is None or binary == info["toolkit"]


def _nvidia(generated: str) -> dict[str, Any]:
    """The nvidia runtime as the agent generated it (its type and options), for a handler of another name."""
    try:
        runtimes = node_toml.loads(generated)["plugins"][CRI_V3_RUNTIME]["containerd"]["runtimes"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return {}
    nvidia = runtimes.get("nvidia") if isinstance(runtimes, dict) else None
    if not isinstance(nvidia, dict):
        return {}
    copied: dict[str, Any] = {"runtime_type": nvidia.get("runtime_type", "io.containerd.runc.v2")}
    if isinstance(nvidia.get("options"), dict):
        copied["options"] = dict(nvidia["options"])
    return copied


def dropin_table(requests: Mapping[str, object], info: ContainerdPlatformInfo, generated: str) -> dict[str, Any]:
    """
    The drop-in's content for the host-data ``requests`` (``platform.runtime_requests``) on a node whose
    agent adds the nvidia runtime itself: only the keys asked, under ``io.containerd.cri.v1.runtime`` (and
    ``io.containerd.nri.v1.nri``): ``default_runtime_name = "nvidia"``, ``enable_cdi``, ``cdi_spec_dirs``,
    nvidia's ``SystemdCgroup``, NRI on (``gpunode_containerd_mode: nri`` also turns CDI on unless
    ``gpunode_enable_cdi`` says otherwise), and a runtime named as the RuntimeClass handler where the
    agent defines none of that name (a copy of the agent's nvidia runtime, from ``generated``).
    """
    runtime: dict[str, Any] = {}
    runtimes: dict[str, Any] = {}
    if requests.get("gpunode_nvidia_default_runtime"):
        runtime.setdefault("containerd", {})["default_runtime_name"] = "nvidia"
    cdi = requests.get("gpunode_enable_cdi")
    if cdi is None and requests.get("gpunode_containerd_mode") == "nri":
        cdi = True
    if cdi is not None:
        runtime["enable_cdi"] = bool(cdi)
    dirs = requests.get("gpunode_cdi_spec_dirs")
    if isinstance(dirs, list | tuple):
        runtime["cdi_spec_dirs"] = [str(entry) for entry in dirs]
    cgroup = requests.get("gpunode_nvidia_systemd_cgroup")
    if cgroup is not None:
        runtimes["nvidia"] = {"options": {"SystemdCgroup": bool(cgroup)}}
    handler = requests.get("gpunode_runtime_handler")
    if isinstance(handler, str) and handler != "nvidia" and handler not in info["runtimes"]:
        copied = _nvidia(generated)
        if cgroup is not None:
            copied.setdefault("options", {})["SystemdCgroup"] = bool(cgroup)
        runtimes[handler] = copied
    if runtimes:
        runtime.setdefault("containerd", {})["runtimes"] = runtimes
    plugins: dict[str, Any] = {CRI_V3_RUNTIME: runtime} if runtime else {}
    if requests.get("gpunode_containerd_mode") == "nri" or requests.get("gpunode_enable_nri"):
        plugins[NRI] = {"disable": False}
    return {"version": 3, "plugins": plugins} if plugins else {}


def render(table: Mapping[str, Any], info: ContainerdPlatformInfo) -> str:
    """The drop-in's text (byte-stable: keys in a fixed order, no time stamps)."""
    return HEADER.format(label=NAMES[info["name"] or ""]) + tomlkit.dumps(dict(table))


def intended(table: Mapping[str, Any]) -> dict[str, Any]:
    """The drop-in's CRI keys, dotted within the CRI runtime plugin's table (as ``candidate_losses`` takes
    them)."""
    return flatten(dict(table.get("plugins", {}).get(CRI_V3_RUNTIME, {})))


def unshown(dump: Mapping[str, Any], table: Mapping[str, Any], path: str) -> list[str]:
    """Each key of the drop-in (``table``) that the merged config (``dump``) does not show with its value:
    a later file overrides it, or containerd did not read the drop-in. Keys are followed as tables nest, so a
    runtime named with a dot (``nvidia.cdi``) is one key."""
    missing = []
    for keys, value in _leaves(dict(table.get("plugins", {}))):
        node: Any = dump.get("plugins", {})
        for part in keys:
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            dotted = ".".join([keys[0], *(f'"{part}"' if "." in part else part for part in keys[1:])])
            missing.append(f"{dotted} = {value!r} from {path} (the merged config has {node!r})")
    return missing


def _leaves(table: Mapping[str, Any], above: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf of ``table`` with the keys that lead to it."""
    found: list[tuple[tuple[str, ...], Any]] = []
    for key, value in table.items():
        if isinstance(value, dict):
            found += _leaves(value, (*above, key))
        else:
            found.append(((*above, key), value))
    return found


def asked_line(table: Mapping[str, Any]) -> str:
    """The drop-in's keys, for the plan and the step's note."""
    return ", ".join(f"{key} = {value!r}" for key, value in flatten(dict(table.get("plugins", {}))).items())


def write_line(info: ContainerdPlatformInfo, table: Mapping[str, Any]) -> str:
    """What the plan says the write does on a k3s or RKE2 node."""
    program = info["name"] or ""
    if not table:
        what = f"empty {dropin_path(program)} (host data asks nothing beyond {NAMES[program]}'s own runtime now)"
    else:
        what = (
            f"write {dropin_path(program)} ({asked_line(table)}; {NAMES[program]} imports it from its generated config)"
        )
    return f"{what}, then restart {info['unit']} (the kubelet restarts with it) and verify on its socket"


def applied_note(info: ContainerdPlatformInfo, table: Mapping[str, Any]) -> str:
    """What the step says where the drop-in already holds what host data asks."""
    program = info["name"] or ""
    sets = f"sets {asked_line(table)}" if table else "sets nothing"
    found = f"{NAMES[program]} adds the nvidia runtime itself: found in {rancher_config(program)}"
    return f"{found}; {dropin_path(program)} {sets}"


def written_table(text: str | None) -> dict[str, Any]:
    """What gpunode's drop-in on the node sets (``{}`` where there is none, or it does not parse)."""
    if not text:
        return {}
    try:
        return node_toml.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def dropped_keys(written: Mapping[str, Any], table: Mapping[str, Any], path: str) -> dict[str, str]:
    """The CRI keys gpunode's drop-in on the node sets (``written``) that the planned one (``table``) no
    longer does, each with the drop-in's path: host data stopped asking for them, so the merged config may
    change there (back to what the agent's own config says)."""
    return {key: path for key in intended(written) if key not in intended(table)}
