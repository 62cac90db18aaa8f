"""Host data as typed settings, grouped by subject, and every key's default written once (no I/O).

``hostdata.KEYS`` takes its defaults from the constants here, and so do the operations' keyword
arguments; each field of a group names the host-data key it comes from (``keys_of``).
``hostdata.settings(data)`` validates host data and builds ``Settings`` from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

# The defaults of the host-data keys (and of the operations' arguments standing for them).
CONTAINERD_RESTART = "rolling"
CONTAINERD_MODE = "runtime"
RESTART_TIMEOUT = 60  # seconds
DROPIN_DIR = "/etc/containerd/conf.d"
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"
RUNTIME_HANDLER = "nvidia"
ROLLOUT_BATCH = 1
HOOK_TIMEOUT = 600  # seconds
DRIVER_SOURCE = "auto"
DRIVER_FLAVOR = "server"
PERSISTENCE_MODE = "auto"
REBOOT_TIMEOUT = 600  # seconds
KERNEL_HOLD = True
UNATTENDED_MODE = "disabled"
UNATTENDED_BLACKLIST = ("linux-", "nvidia-", "libnvidia-", "containerd", "cri-tools")
NEEDRESTART_KEEP = ("containerd", "kubelet")
TOOLKIT_SOURCE = "auto"
CDI_SPEC_PATH = "/etc/cdi/nvidia.yaml"
CDI_OWNER = "auto"

_KEY = "key"  # a field's metadata: the host-data key it comes from


def _key(name: str) -> dict[str, str]:
    """A settings field's metadata: it is read from host-data key ``name``."""
    return {_KEY: name}


@dataclass(frozen=True)
class ContainerdSettings:
    """How containerd's config is written and restarted."""

    restart: str = field(default=CONTAINERD_RESTART, metadata=_key("gpunode_containerd_restart"))
    restart_timeout: int = field(default=RESTART_TIMEOUT, metadata=_key("gpunode_restart_timeout"))
    mode: str = field(default=CONTAINERD_MODE, metadata=_key("gpunode_containerd_mode"))
    enable_nri: bool | None = field(default=None, metadata=_key("gpunode_enable_nri"))
    dropin_dir: str = field(default=DROPIN_DIR, metadata=_key("gpunode_containerd_dropin_dir"))
    cdi_spec_dirs: list[str] | None = field(default=None, metadata=_key("gpunode_cdi_spec_dirs"))
    enable_cdi: bool | None = field(default=None, metadata=_key("gpunode_enable_cdi"))


@dataclass(frozen=True)
class RuntimeSettings:
    """The nvidia runtime containerd is given."""

    binary: str = field(default=RUNTIME_BINARY, metadata=_key("gpunode_nvidia_runtime_binary"))
    systemd_cgroup: bool | None = field(default=None, metadata=_key("gpunode_nvidia_systemd_cgroup"))
    default_runtime: bool = field(default=False, metadata=_key("gpunode_nvidia_default_runtime"))
    handler: str = field(default=RUNTIME_HANDLER, metadata=_key("gpunode_runtime_handler"))
    take_over: bool = field(default=False, metadata=_key("gpunode_take_over_runtime"))
    binary_required: bool = field(default=False, metadata=_key("gpunode_runtime_binary_required"))


@dataclass(frozen=True)
class RolloutSettings:
    """The order and pace of the rollout's turns: one value for every host of a run."""

    order: list[str] = field(default_factory=list, metadata=_key("gpunode_rollout_order"))
    batch: int | str = field(default=ROLLOUT_BATCH, metadata=_key("gpunode_rollout_batch"))
    canary: int = field(default=0, metadata=_key("gpunode_rollout_canary"))
    max_failed: int = field(default=0, metadata=_key("gpunode_rollout_max_failed"))


@dataclass(frozen=True)
class HookSettings:
    """The controller-side commands around a node's turn (argv lists, ``[]``: none)."""

    before: list[str] = field(default_factory=list, metadata=_key("gpunode_rollout_before"))
    after: list[str] = field(default_factory=list, metadata=_key("gpunode_rollout_after"))
    timeout: float = field(default=HOOK_TIMEOUT, metadata=_key("gpunode_hook_timeout"))
    node_name: str | None = field(default=None, metadata=_key("gpunode_node_name"))


@dataclass(frozen=True)
class DriverSettings:
    """The NVIDIA driver: where it comes from, which, and whether the node may reboot for it."""

    source: str = field(default=DRIVER_SOURCE, metadata=_key("gpunode_driver_source"))
    branch: str | None = field(default=None, metadata=_key("gpunode_driver_branch"))
    version: str | None = field(default=None, metadata=_key("gpunode_driver_version"))
    flavor: str = field(default=DRIVER_FLAVOR, metadata=_key("gpunode_driver_flavor"))
    allow_dkms: bool = field(default=False, metadata=_key("gpunode_allow_dkms"))
    mok_enrolled: bool = field(default=False, metadata=_key("gpunode_mok_enrolled"))
    reboot: bool = field(default=False, metadata=_key("gpunode_reboot"))
    reboot_timeout: int = field(default=REBOOT_TIMEOUT, metadata=_key("gpunode_reboot_timeout"))
    replace_preinstalled: bool = field(default=False, metadata=_key("gpunode_driver_replace_preinstalled"))
    persistence_mode: str = field(default=PERSISTENCE_MODE, metadata=_key("gpunode_persistence_mode"))


@dataclass(frozen=True)
class UpdateSettings:
    """What may change on the node by itself: kernel holds, unattended-upgrades, needrestart."""

    kernel_hold: bool = field(default=KERNEL_HOLD, metadata=_key("gpunode_kernel_hold"))
    unattended: str = field(default=UNATTENDED_MODE, metadata=_key("gpunode_unattended_upgrades"))
    blacklist: list[str] = field(
        default_factory=lambda: list(UNATTENDED_BLACKLIST), metadata=_key("gpunode_unattended_blacklist")
    )
    needrestart_keep: list[str] = field(
        default_factory=lambda: list(NEEDRESTART_KEEP), metadata=_key("gpunode_needrestart_keep")
    )


@dataclass(frozen=True)
class ToolkitSettings:
    """The NVIDIA Container Toolkit: where it comes from and which version."""

    source: str = field(default=TOOLKIT_SOURCE, metadata=_key("gpunode_toolkit_source"))
    version: str | None = field(default=None, metadata=_key("gpunode_toolkit_version"))
    deb_dir: str | None = field(default=None, metadata=_key("gpunode_toolkit_deb_dir"))


@dataclass(frozen=True)
class CdiSettings:
    """The node's NVIDIA CDI spec."""

    spec_path: str = field(default=CDI_SPEC_PATH, metadata=_key("gpunode_cdi_spec_path"))
    owner: str = field(default=CDI_OWNER, metadata=_key("gpunode_cdi_owner"))


@dataclass(frozen=True)
class ReadinessSettings:
    """The readiness report."""

    json_path: str | None = field(default=None, metadata=_key("gpunode_readiness_json"))


@dataclass(frozen=True)
class Settings:
    """Every ``gpunode_`` host-data key of one host, by subject."""

    containerd: ContainerdSettings = field(default_factory=ContainerdSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    hooks: HookSettings = field(default_factory=HookSettings)
    driver: DriverSettings = field(default_factory=DriverSettings)
    updates: UpdateSettings = field(default_factory=UpdateSettings)
    toolkit: ToolkitSettings = field(default_factory=ToolkitSettings)
    cdi: CdiSettings = field(default_factory=CdiSettings)
    readiness: ReadinessSettings = field(default_factory=ReadinessSettings)


GROUPS: dict[str, type[Any]] = {
    "containerd": ContainerdSettings,
    "runtime": RuntimeSettings,
    "rollout": RolloutSettings,
    "hooks": HookSettings,
    "driver": DriverSettings,
    "updates": UpdateSettings,
    "toolkit": ToolkitSettings,
    "cdi": CdiSettings,
    "readiness": ReadinessSettings,
}


def keys_of(group: type[Any]) -> dict[str, str]:
    """``group``'s fields by the host-data key each comes from: key -> field name."""
    return {item.metadata[_KEY]: item.name for item in fields(group)}


def default_of(key: str) -> Any:
    """The default of host-data key ``key`` (a fresh list for a list), as its field has it."""
    item = _FIELDS[key]
    return item.default_factory() if callable(item.default_factory) else item.default


def group_from(group: type[Any], values: Mapping[str, Any]) -> Any:
    """``group`` filled from ``values`` (host-data key -> value), defaults for keys it lacks."""
    return group(**{name: values[key] for key, name in keys_of(group).items() if key in values})


def from_values(values: Mapping[str, Any]) -> Settings:
    """``Settings`` from validated host data (``hostdata.validate``'s key -> value)."""
    return Settings(**{name: group_from(group, values) for name, group in GROUPS.items()})


def to_values(settings: Settings) -> dict[str, Any]:
    """The host-data keys and values ``settings`` holds (the reverse of ``from_values``)."""
    values = {}
    for name, group in GROUPS.items():
        for key, field_name in keys_of(group).items():
            values[key] = getattr(getattr(settings, name), field_name)
    return values


# Every key's field, looked up once: ``default_of`` runs for each key of each host's validation.
_FIELDS: dict[str, Field[Any]] = {item.metadata[_KEY]: item for group in GROUPS.values() for item in fields(group)}
RUN_WIDE_KEYS: Sequence[str] = tuple(keys_of(RolloutSettings))
