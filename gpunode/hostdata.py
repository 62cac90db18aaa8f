"""The host-data keys the deploys read, with their types and defaults (no I/O).

Every key is prefixed ``gpunode_`` so it never collides with other libraries' data. The
README's host-data table is checked against ``KEYS`` by the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "gpunode_"


class HostDataError(ValueError):
    """A host-data value is unknown or of the wrong type; the message names the key."""


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


@dataclass(frozen=True)
class Key:
    name: str
    kind: str  # shown in the README: "bool", "str", "list[str]", "one of: a, b"
    default: Any
    doc: str
    check: Callable[[Any], bool]


def _choice(*values: str) -> Callable[[Any], bool]:
    return lambda value: value in values


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _abs_path(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/")


KEYS: dict[str, Key] = {
    key.name: key
    for key in [
        Key(
            "gpunode_containerd_restart",
            "one of: rolling, none",
            "rolling",
            "`rolling` restarts containerd one node at a time after its config changed and verifies it; "
            "`none` only writes files (image builds, chroots)",
            _choice("rolling", "none"),
        ),
        Key(
            "gpunode_containerd_config",
            "absolute path",
            "/etc/containerd/config.toml",
            "containerd's main config file, as the service starts it",
            _abs_path,
        ),
        Key(
            "gpunode_containerd_dropin_dir",
            "absolute path",
            "/etc/containerd/conf.d",
            "directory of containerd drop-ins; config.toml's `imports` is made to cover `<dir>/*.toml`",
            _abs_path,
        ),
        Key(
            "gpunode_nvidia_runtime_binary",
            "absolute path",
            "/usr/bin/nvidia-container-runtime",
            "`BinaryName` of the nvidia runtime",
            _abs_path,
        ),
        Key(
            "gpunode_nvidia_systemd_cgroup",
            "bool or null",
            None,
            "`SystemdCgroup` of the nvidia runtime; null follows runc's setting",
            lambda value: value is None or isinstance(value, bool),
        ),
        Key(
            "gpunode_nvidia_default_runtime",
            "bool",
            False,
            "make nvidia containerd's default runtime (otherwise the default is left as it is)",
            _bool,
        ),
        Key(
            "gpunode_runtime_binary_required",
            "bool",
            False,
            "fail (instead of warn) when the nvidia runtime binary is missing on the node",
            _bool,
        ),
        Key(
            "gpunode_cdi_spec_dirs",
            "list[str]",
            ["/etc/cdi", "/var/run/cdi"],
            "CDI spec directories given to containerd (`cdi_spec_dirs`, containerd 1.7 and 2.x)",
            lambda value: _is_str_list(value) and all(item.startswith("/") for item in value),
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
        value = data.get(name, key.default)
        if not key.check(value):
            raise HostDataError(f"host-data key {name!r} must be {key.kind}, got {value!r}")
        values[name] = value
    return values
