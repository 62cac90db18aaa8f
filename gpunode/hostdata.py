"""The host-data keys the deploys read, with their types, and their validation (no I/O).

Every key is prefixed ``gpunode_`` so it never collides with other libraries' data. The
host-data table of docs/host-data.md is checked against ``KEYS`` by the tests. Each key's default is
its field's in ``settings``, and ``settings(data)`` gives a host's validated data as ``Settings``.
"""

from __future__ import annotations

import os.path
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra_gpunode.log import CONTROL, without_controls
from pyinfra_gpunode.needrestart import check_services
from pyinfra_gpunode.persistence import MODES as PERSISTENCE_MODES
from pyinfra_gpunode.settings import (
    GROUPS,
    RUN_WIDE_KEYS,
    RolloutSettings,
    Settings,
    default_of,
    from_values,
    group_from,
    keys_of,
    to_values,
)
from pyinfra_gpunode.unattended import check_blacklist

PREFIX = "gpunode_"
MAX_RESTART_TIMEOUT = 3600
REBOOT_TIMEOUTS = (60, 7200)  # seconds a rebooted node may take to answer again, least and most


class HostDataError(ValueError):
    """A host-data value is unknown or of the wrong type; the message names the key."""


def batch_value_problem(value: Any) -> str | None:
    """Why ``value`` is no ``gpunode_rollout_batch`` (a whole number >= 1 or a percentage
    ``"N%"`` with 0 < N <= 100), or ``None``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value >= 1 else "a whole number must be at least 1"
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,3}%", value) and 0 < int(value[:-1]) <= 100:
        return None
    return "neither a whole number >= 1 nor a percentage from 1% to 100%"


# A Kubernetes node name: an RFC 1123 subdomain (lowercase labels of letters, digits and '-', joined by '.').
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NODE_NAME_MAX = 253


def is_node_name(value: Any) -> bool:
    """Whether ``value`` is a valid Kubernetes node name (RFC 1123 subdomain, at most 253 characters)."""
    return isinstance(value, str) and len(value) <= NODE_NAME_MAX and NODE_NAME.fullmatch(value) is not None


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _passes(check: Callable[[Sequence[str]], None]) -> Callable[[Any], bool]:
    """A key's check: a list of strings that ``check`` (which raises ``ValueError``) takes."""

    def passes(value: Any) -> bool:
        if not _is_str_list(value):
            return False
        try:
            check(value)
        except ValueError:
            return False
        return True

    return passes


@dataclass(frozen=True)
class Key:
    name: str
    kind: str  # shown in the host-data tables: "bool", "str", "list[str]", "one of: a, b"
    doc: str
    check: Callable[[Any], bool]
    # A whole number stands for its digits (``--data gpunode_driver_branch=580`` parses to an int).
    number_as_text: bool = False
    # A path (or list of paths) on the node: warned about under a world-writable directory.
    node_path: bool = False

    @property
    def default(self) -> Any:
        """The value when host data does not set the key, written once: its field's in ``settings``."""
        return default_of(self.name)


def _choice(*values: str) -> Callable[[Any], bool]:
    return lambda value: value in values


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _runtime_name(value: Any) -> bool:
    """A containerd runtime name as a RuntimeClass handler may be: a DNS label-like word."""
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", value) is not None


def is_normal_path(value: Any) -> bool:
    """An absolute path written the one way ``os.path.normpath`` writes it: no ``.`` or ``..``
    component, no ``//``, no trailing ``/`` (except ``/`` itself)."""
    return (
        isinstance(value, str)
        and value.startswith("/")
        and not value.startswith("//")
        and (os.path.normpath(value) == value)
    )


def _abs_path(value: Any) -> bool:
    return is_normal_path(value)


def _abs_path_list(value: Any) -> bool:
    return _is_str_list(value) and all(is_normal_path(item) for item in value)


# Directories anyone may write to (sticky or not): a path under one of them can be planted or
# swapped by any local user, and /tmp, /dev/shm are emptied at boot.
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


PATH_KIND = "absolute normalised path"

KEYS: dict[str, Key] = {
    key.name: key
    for key in [
        Key(
            "gpunode_containerd_restart",
            "one of: rolling, none",
            "`rolling` restarts containerd one node at a time after its config changed and verifies it; "
            "`none` only writes files (image builds, chroots); a driver change still waits for the node's turn",
            _choice("rolling", "none"),
        ),
        Key(
            "gpunode_rollout_order",
            "list[str]",
            "hosts whose containerd restarts first, in this order (a canary); the rest follow in inventory "
            "order. Same value on every host (set it for the `all` group)",
            _is_str_list,
        ),
        Key(
            "gpunode_rollout_batch",
            'int >= 1, or a percentage such as "10%"',
            "how many nodes take their turn at the same time once the canary is done; a percentage is of the "
            "nodes in the run (rounded down, at least 1). Nodes out of service before the rollout (unreachable, "
            "containerd down, CRI failed) count against it. Same value on every host",
            lambda value: batch_value_problem(value) is None,
        ),
        Key(
            "gpunode_rollout_canary",
            "int >= 0",
            "how many nodes, first in rollout order, take their turn alone before any batch; a failure among them "
            "halts the rollout. Same value on every host",
            lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        ),
        Key(
            "gpunode_rollout_max_failed",
            "int >= 0",
            "how many failed turns the rollout goes on past; once more have failed no new turn starts (turns "
            "already running finish). Same value on every host",
            lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        ),
        Key(
            "gpunode_restart_timeout",
            f"int, 1 to {MAX_RESTART_TIMEOUT}",
            "seconds a restarted containerd may take until its CRI plugin reports",
            lambda value: isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_RESTART_TIMEOUT,
        ),
        Key(
            "gpunode_rollout_before",
            "list[str]",
            "command run on the controller (argv, no shell) before a node's turn, e.g. to cordon and drain it; "
            "`{node}` (inventory name) and `{hostname}` (`gpunode_node_name`) are filled in, the planned changes are "
            "in `GPUNODE_CHANGES`; failing leaves the node untouched and halts the rollout. `[]`: no hook",
            _is_str_list,
        ),
        Key(
            "gpunode_node_name",
            "str (a Kubernetes node name) or null",
            "this host's Kubernetes node name, given to its hooks as `{hostname}` and `GPUNODE_HOSTNAME`; the node "
            "must answer to it (its hostname, or the kubelet's `--hostname-override`) or no hook runs. None: the name "
            "the node reports. Two hosts of a run with one name, or one machine (`/etc/machine-id`) under two "
            "inventory names, fail before any hook",
            lambda value: value is None or is_node_name(value),
        ),
        Key(
            "gpunode_rollout_after",
            "list[str]",
            "command run on the controller after a node's turn succeeded (uncordon, wait for its GPUs); same "
            "placeholders and environment as `gpunode_rollout_before`; failing halts the rollout after this node",
            _is_str_list,
        ),
        Key(
            "gpunode_hook_timeout",
            "number > 0",
            "seconds each rollout hook may run before it is killed and counts as failed",
            lambda value: isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
        ),
        Key(
            "gpunode_containerd_mode",
            "one of: runtime, nri",
            "`runtime` registers the nvidia runtime (the RuntimeClass handler below); `nri` registers no runtime "
            "and turns on containerd's NRI plugin and CDI instead (containerd 1.7 and later), for clusters whose "
            "GPU Operator injects devices with its NRI plugin; a node switched to `nri` loses the nvidia runtime "
            "gpunode registered, and the plan says so",
            _choice("runtime", "nri"),
        ),
        Key(
            "gpunode_enable_nri",
            "true or null",
            "with `gpunode_containerd_mode: nri`: `true` turns NRI on even where a config file sets `disable = true` "
            "for `io.containerd.nri.v1.nri`; null keeps such a file's value (the plan says NRI stays off), else on",
            lambda value: value is None or value is True,
        ),
        Key(
            "gpunode_containerd_dropin_dir",
            PATH_KIND,
            "directory of containerd drop-ins; config.toml's `imports` is made to cover `<dir>/*.toml`",
            _abs_path,
            node_path=True,
        ),
        Key(
            "gpunode_nvidia_runtime_binary",
            PATH_KIND,
            "`BinaryName` of the nvidia runtime",
            _abs_path,
            node_path=True,
        ),
        Key(
            "gpunode_nvidia_systemd_cgroup",
            "bool or null",
            "`SystemdCgroup` of the nvidia runtime; null keeps what a config file sets for nvidia, else as the "
            "default runtime it is copied from has it",
            lambda value: value is None or isinstance(value, bool),
        ),
        Key(
            "gpunode_nvidia_default_runtime",
            "bool",
            "make nvidia containerd's default runtime (otherwise the default is left as it is); off by default: "
            "in CDI mode GPU pods ask for the runtime through their RuntimeClass, and a default nvidia runtime "
            "would wrap every pod of the node",
            _bool,
        ),
        Key(
            "gpunode_runtime_handler",
            "runtime name (letters, digits, `-`, `_`, `.`)",
            "the `handler` of the cluster's RuntimeClass for GPU pods: the plan and the readiness report check "
            "that containerd has a runtime of this name running the toolkit's binary",
            _runtime_name,
        ),
        Key(
            "gpunode_take_over_runtime",
            "bool",
            "where the GPU Operator's toolkit manages the nvidia runtime, write gpunode's anyway (it loads after "
            "the operator's drop-in, which is left in place); without it such a node fails before any change",
            _bool,
        ),
        Key(
            "gpunode_runtime_binary_required",
            "bool",
            "fail (instead of warn) when the nvidia runtime binary is missing on the node",
            _bool,
        ),
        Key(
            "gpunode_cdi_spec_dirs",
            f"list of {PATH_KIND}s or null",
            "CDI spec directories given to containerd (`cdi_spec_dirs`, containerd 1.7 and 2.x); null keeps what "
            'containerd\'s config files set, else `["/etc/cdi", "/var/run/cdi"]`',
            lambda value: value is None or _abs_path_list(value),
            node_path=True,
        ),
        Key(
            "gpunode_enable_cdi",
            "bool or null",
            "`enable_cdi` of containerd's CRI plugin (containerd 1.7 and 2.x); null keeps what containerd's config "
            "files set, else on",
            lambda value: value is None or isinstance(value, bool),
        ),
        Key(
            "gpunode_driver_branch",
            "str or null",
            "NVIDIA driver branch (`580`); the newest version of it is installed once, then pinned and held",
            lambda value: value is None or (isinstance(value, str) and value.isdigit() and len(value) == 3),
            number_as_text=True,
        ),
        Key(
            "gpunode_driver_version",
            "str or null",
            "exact NVIDIA driver version (`580.126.20`), pinned and held; implies the branch",
            lambda value: value is None or isinstance(value, str),
            number_as_text=True,
        ),
        Key(
            "gpunode_driver_source",
            "one of: auto, packages, preinstalled",
            "`packages`: install the branch or version above from the distribution's packages, pinned and "
            "held; `preinstalled`: keep the driver the node has (cloud and golden images, runfile installs, "
            "driver containers), never touch driver packages, require it loaded and matching its userspace "
            "(and equal to `gpunode_driver_version` when set); `auto` fits both kinds of node: `packages` "
            "when a branch or version is set, else the loaded driver; a GPU node with neither stops there",
            _choice("auto", "packages", "preinstalled"),
        ),
        Key(
            "gpunode_driver_replace_preinstalled",
            "bool",
            "with `packages`, install driver packages even on a node whose loaded driver did not come from "
            "packages (its libnvidia-ml belongs to no package); otherwise such a node is refused",
            _bool,
        ),
        Key(
            "gpunode_driver_flavor",
            "one of: server, server-open, default, open",
            "driver package flavour (Ubuntu `-server`/`-open` packages; on Debian `open` picks "
            "`nvidia-open-kernel-dkms`)",
            _choice("server", "server-open", "default", "open"),
        ),
        Key(
            "gpunode_persistence_mode",
            "one of: auto, on, off",
            "persistence mode: `on` keeps nvidia-persistenced enabled and running (GPUs stay initialised with no "
            "program using them), `off` keeps it stopped; `auto` is `on` where a GPU is a datacenter one (PCI "
            "class 3D controller) and `off` otherwise. The readiness report warns where it is asked on and is off",
            _choice(*PERSISTENCE_MODES),
        ),
        Key(
            "gpunode_allow_dkms",
            "bool",
            "allow a DKMS-built module (Debian always needs it; Ubuntu only without signed precompiled modules)",
            _bool,
        ),
        Key(
            "gpunode_mok_enrolled",
            "bool",
            "the DKMS signing key is enrolled in the node's MOK list, so DKMS may be used under Secure Boot",
            _bool,
        ),
        Key(
            "gpunode_reboot",
            "bool",
            "reboot a node whose installed driver differs from the loaded module, then check it again; a "
            "driver the turn installed in place of another that is not loaded then is put back, rebooted into",
            _bool,
        ),
        Key(
            "gpunode_reboot_timeout",
            f"int, {REBOOT_TIMEOUTS[0]} to {REBOOT_TIMEOUTS[1]}",
            "seconds a node rebooted for its driver may take to answer again with a new boot id",
            lambda value: (
                isinstance(value, int)
                and not isinstance(value, bool)
                and REBOOT_TIMEOUTS[0] <= value <= REBOOT_TIMEOUTS[1]
            ),
        ),
        Key(
            "gpunode_kernel_hold",
            "bool",
            "hold the running kernel's packages and kernel meta packages (`false` releases the holds)",
            _bool,
        ),
        Key(
            "gpunode_unattended_upgrades",
            "one of: disabled, blacklist",
            "`disabled`: apt periodic jobs, timers and service off; `blacklist`: security updates stay, "
            "linux-*, nvidia-*, libnvidia-*, containerd, cri-tools never upgraded unattended",
            _choice("disabled", "blacklist"),
        ),
        Key(
            "gpunode_unattended_blacklist",
            "list[str] of package-name prefixes (lower case, like 'nvidia-')",
            "package-name prefixes unattended-upgrades must skip in `blacklist` mode",
            _passes(check_blacklist),
        ),
        Key(
            "gpunode_needrestart_keep",
            "list[str] of unit names without '.service' (like 'containerd')",
            "services needrestart never restarts on its own (`nvidia-*` always added; list-only mode)",
            _passes(check_services),
        ),
        Key(
            "gpunode_toolkit_source",
            "one of: auto, repository, deb_dir, installed",
            "where the NVIDIA Container Toolkit comes from: NVIDIA's apt repository (key pinned by "
            "fingerprint), a directory of .deb files on the node, or already installed (only checked: its "
            "packages, or nvidia-ctk and nvidia-container-runtime on PATH); `auto` fits every node: "
            "`installed` where the toolkit is present, else `repository`",
            _choice("auto", "repository", "deb_dir", "installed"),
        ),
        Key(
            "gpunode_toolkit_version",
            "str or null",
            "NVIDIA Container Toolkit package version (`1.17.8-1`) for all four packages, pinned and held; "
            "null: the newest the repository offers, once, then kept",
            lambda value: value is None or isinstance(value, str),
            number_as_text=True,
        ),
        Key(
            "gpunode_toolkit_deb_dir",
            f"{PATH_KIND} or null",
            "directory on the node holding the toolkit's .deb files (`gpunode_toolkit_source: deb_dir`)",
            lambda value: value is None or _abs_path(value),
            node_path=True,
        ),
        Key(
            "gpunode_cdi_spec_path",
            PATH_KIND,
            "CDI spec generated with nvidia-ctk when missing, not matching the loaded driver or not listing every GPU "
            "by index plus `all`; the default survives a reboot (`/var/run/cdi` is a tmpfs emptied at boot)",
            _abs_path,
            node_path=True,
        ),
        Key(
            "gpunode_cdi_owner",
            "one of: auto, project, refresh",
            "who writes the node's NVIDIA CDI spec: `project` (nvidia-ctk at `gpunode_cdi_spec_path`), `refresh` "
            "(the toolkit's nvidia-cdi-refresh.service, 1.18 and later, at /var/run/cdi/nvidia.yaml: started when its "
            "spec is stale, given no start limit; a spec at `gpunode_cdi_spec_path` is reported as a duplicate, "
            "never deleted); `auto`: `refresh` where that service is installed, else `project`, which also "
            "writes it where the driver comes from the GPU Operator's driver container (the service looks for "
            "the driver on the host)",
            _choice("auto", "project", "refresh"),
        ),
        Key(
            "gpunode_readiness_json",
            "str or null",
            "file on the controller where the readiness report (every node, every link, versions, causes) is "
            "written as JSON; null: printed only",
            lambda value: value is None or (isinstance(value, str) and bool(value)),
        ),
    ]
}


def validate(data: Mapping[str, Any]) -> dict[str, Any]:
    """Return every ``gpunode_`` key's value (defaults filled in); raise naming a bad key."""
    unknown = sorted(key for key in data if key.startswith(PREFIX) and key not in KEYS)
    if unknown:
        raise HostDataError(f"unknown host-data key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    values = {}
    for name, key in KEYS.items():
        value = _from_command_line(key, data.get(name, key.default))
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and CONTROL.search(text) for text in texts):
            raise HostDataError(
                f"host-data key {name!r} must not contain newlines or control characters, got {_visible(value)}"
            )
        if not key.check(value):
            raise HostDataError(f"host-data key {name!r} must be {key.kind}, got {value!r}")
        values[name] = value
    _check_mode(values)
    return values


def settings(data: Mapping[str, Any]) -> Settings:
    """``data``'s ``gpunode_`` keys validated (``validate``), grouped by subject as ``Settings``."""
    return from_values(validate(data))


def rollout_settings(datas: Sequence[Mapping[str, Any]]) -> RolloutSettings:
    """The rollout's order and pace from every host's data (``datas``), which must give each of them
    one value (defaults filled in); ``HostDataError`` names a key that differs. Not validated here:
    each host's own ``validate`` names a bad value."""
    for key in RUN_WIDE_KEYS:
        default = default_of(key)
        if len({repr(data.get(key, default)) for data in datas}) > 1:
            raise HostDataError(f"host-data key {key!r} differs between hosts; set it once for all")
    return group_from(RolloutSettings, datas[0]) if datas else RolloutSettings()


def _check_mode(values: Mapping[str, Any]) -> None:
    """Keys that contradict ``gpunode_containerd_mode``: refused naming both."""
    mode = values["gpunode_containerd_mode"]
    if mode == "nri" and values["gpunode_nvidia_default_runtime"]:
        raise HostDataError(
            "host-data key 'gpunode_nvidia_default_runtime' must be false with gpunode_containerd_mode: nri, "
            "which registers no nvidia runtime"
        )
    if mode != "nri" and values["gpunode_enable_nri"] is not None:
        raise HostDataError(
            f"host-data key 'gpunode_enable_nri' applies only with gpunode_containerd_mode: nri, got mode {mode!r}; "
            "leave it unset (null)"
        )


def world_writable_warnings(values: Mapping[str, Any] | Settings) -> list[str]:
    """One warning per path key of ``values`` (validated) lying in a directory anyone may write to."""
    if isinstance(values, Settings):
        values = to_values(values)
    warnings = []
    for name, key in KEYS.items():
        value = values.get(name)
        for path in value if isinstance(value, list) else [value]:
            if key.node_path and isinstance(path, str) and in_world_writable(path):
                warnings.append(
                    f"host-data key {name!r} is {path!r}, under a directory anyone may write to "
                    f"({', '.join(WORLD_WRITABLE)}): any local user can plant or replace it"
                )
    return warnings


def in_world_writable(path: str) -> bool:
    """Whether the normalised absolute ``path`` is one of ``WORLD_WRITABLE`` or lies under one."""
    return any(path == top or path.startswith(top + "/") for top in WORLD_WRITABLE)


def _visible(value: Any) -> str:
    """``value`` as Python writes it, control characters shown as ``<U+000A>`` (no backslash for a shell to eat)."""
    if isinstance(value, list):
        return "[" + ", ".join(_visible(item) for item in value) + "]"
    if isinstance(value, str):
        return "'" + without_controls(value) + "'"
    return repr(value)


def _from_command_line(key: Key, value: Any) -> Any:
    """A value pyinfra's ``--data`` parsed into a number, as the text it was where that is unambiguous.

    ``--data k=580`` gives the int 580 (its digits are the text); ``--data k=580.10`` gives the
    float 580.1, whose text is lost: refused, naming the key and how to quote it.
    """
    if not key.number_as_text or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        raise HostDataError(
            f"host-data key {key.name!r} must be {key.kind}, got the number {value!r}, which may have lost "
            f"digits (580.10 reads as 580.1): quote it, on the command line as --data '{key.name}=\"<value>\"'"
        )
    return value


def markdown_table() -> str:
    """The host-data tables of docs/host-data.md and docs/reference.md, one per settings group
    (``settings.GROUPS``), keys in table order."""
    parts = []
    for name, group in GROUPS.items():
        keys = keys_of(group)
        summary = " ".join((group.__doc__ or "").split()).replace("``", "`")
        rows = [
            f"**{name}** (`Settings.{name}`): {summary}",
            "",
            "| key | type | default | meaning |",
            "|---|---|---|---|",
        ]
        for key in (key for key in KEYS.values() if key.name in keys):
            default = "null" if key.default is None else repr(key.default).replace("'", '"').replace("False", "false")
            default = default.replace("True", "true")
            rows.append(f"| `{key.name}` | {key.kind} | `{default}` | {key.doc} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)
