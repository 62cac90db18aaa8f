"""Host data as typed, grouped settings: each default written once, each field read from its own key."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode import settings as defaults
from pyinfra_gpunode.hostdata import KEYS, HostDataError, rollout_settings, settings, validate, world_writable_warnings
from pyinfra_gpunode.pipelines.gpu_node import _rollout_policy, _runtime, host_settings
from pyinfra_gpunode.rollout import RolloutPolicy
from pyinfra_gpunode.settings import (
    GROUPS,
    RolloutSettings,
    Settings,
    from_values,
    keys_of,
    to_values,
)

REPO = Path(__file__).resolve().parents[2]

# Every key, a valid value that is not its default, and the field of Settings that must hold it.
NOT_DEFAULT: dict[str, tuple[str, Any]] = {
    "gpunode_containerd_restart": ("containerd.restart", "none"),
    "gpunode_restart_timeout": ("containerd.restart_timeout", 90),
    "gpunode_containerd_mode": ("containerd.mode", "nri"),
    "gpunode_enable_nri": ("containerd.enable_nri", True),
    "gpunode_containerd_dropin_dir": ("containerd.dropin_dir", "/etc/containerd/more.d"),
    "gpunode_cdi_spec_dirs": ("containerd.cdi_spec_dirs", ["/etc/cdi"]),
    "gpunode_enable_cdi": ("containerd.enable_cdi", False),
    "gpunode_nvidia_runtime_binary": ("runtime.binary", "/opt/nvidia/runtime"),
    "gpunode_nvidia_systemd_cgroup": ("runtime.systemd_cgroup", True),
    "gpunode_nvidia_default_runtime": ("runtime.default_runtime", False),  # must stay false in nri mode
    "gpunode_runtime_handler": ("runtime.handler", "nvidia-cdi"),
    "gpunode_take_over_runtime": ("runtime.take_over", True),
    "gpunode_runtime_binary_required": ("runtime.binary_required", True),
    "gpunode_rollout_order": ("rollout.order", ["node2", "node1"]),
    "gpunode_rollout_batch": ("rollout.batch", "10%"),
    "gpunode_rollout_canary": ("rollout.canary", 2),
    "gpunode_rollout_max_failed": ("rollout.max_failed", 3),
    "gpunode_rollout_before": ("hooks.before", ["kubectl", "drain", "{node}"]),
    "gpunode_rollout_after": ("hooks.after", ["kubectl", "uncordon", "{node}"]),
    "gpunode_hook_timeout": ("hooks.timeout", 2.5),
    "gpunode_node_name": ("hooks.node_name", "gpu-a17"),
    "gpunode_driver_source": ("driver.source", "packages"),
    "gpunode_driver_branch": ("driver.branch", "580"),
    "gpunode_driver_version": ("driver.version", "580.126.20"),
    "gpunode_driver_flavor": ("driver.flavor", "open"),
    "gpunode_allow_dkms": ("driver.allow_dkms", True),
    "gpunode_mok_enrolled": ("driver.mok_enrolled", True),
    "gpunode_reboot": ("driver.reboot", True),
    "gpunode_reboot_timeout": ("driver.reboot_timeout", 900),
    "gpunode_driver_replace_preinstalled": ("driver.replace_preinstalled", True),
    "gpunode_persistence_mode": ("driver.persistence_mode", "on"),
    "gpunode_kernel_hold": ("updates.kernel_hold", False),
    "gpunode_unattended_upgrades": ("updates.unattended", "blacklist"),
    "gpunode_unattended_blacklist": ("updates.blacklist", ["linux-"]),
    "gpunode_needrestart_keep": ("updates.needrestart_keep", ["kubelet"]),
    "gpunode_toolkit_source": ("toolkit.source", "deb_dir"),
    "gpunode_toolkit_version": ("toolkit.version", "1.17.8-1"),
    "gpunode_toolkit_deb_dir": ("toolkit.deb_dir", "/srv/toolkit"),
    "gpunode_cdi_spec_path": ("cdi.spec_path", "/etc/cdi/gpus.yaml"),
    "gpunode_cdi_owner": ("cdi.owner", "refresh"),
    "gpunode_readiness_json": ("readiness.json_path", "readiness.json"),
}


def _field(found: Settings, path: str) -> Any:
    group, name = path.split(".")
    return getattr(getattr(found, group), name)


def test_every_key_is_one_field_and_every_field_one_key() -> None:
    assert set(NOT_DEFAULT) == set(KEYS)
    fields = [(name, item.name) for name, group in GROUPS.items() for item in dataclasses.fields(group)]
    assert len(fields) == len(KEYS)
    for key, (path, _) in NOT_DEFAULT.items():
        group, name = path.split(".")
        assert keys_of(GROUPS[group])[key] == name


def test_each_group_holds_its_keys_values() -> None:
    data = {key: value for key, (_, value) in NOT_DEFAULT.items()}
    found = settings(data)
    for key, (path, value) in NOT_DEFAULT.items():
        assert _field(found, path) == value, key
        assert _field(found, path) != _field(Settings(), path) or key == "gpunode_nvidia_default_runtime", key
    assert to_values(found) == validate(data)
    assert from_values(validate(data)) == found


def test_defaults_are_the_keys_defaults_written_once() -> None:
    assert settings({}) == Settings()
    assert to_values(Settings()) == validate({}) == {name: key.default for name, key in KEYS.items()}
    assert Settings().runtime.binary == defaults.RUNTIME_BINARY == KEYS["gpunode_nvidia_runtime_binary"].default
    assert Settings().updates.blacklist == list(defaults.UNATTENDED_BLACKLIST)
    # A list default is a fresh list each time: changing one host's value changes no other's.
    assert Settings().updates.blacklist is not Settings().updates.blacklist
    assert KEYS["gpunode_needrestart_keep"].default is not KEYS["gpunode_needrestart_keep"].default


def _string_defaults() -> set[str]:
    return {value for name, value in vars(defaults).items() if name.isupper() and isinstance(value, str)}


def _literal_defaults(path: Path, literals: set[str]) -> list[str]:
    """Keyword defaults and class-level field defaults in ``path`` written as one of ``literals``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            values = [*node.args.defaults, *(item for item in node.args.kw_defaults if item is not None)]
        elif isinstance(node, ast.ClassDef):
            values = [item.value for item in node.body if isinstance(item, ast.AnnAssign) and item.value is not None]
        else:
            continue
        found += [
            f"{path.relative_to(REPO)}:{value.lineno} {value.value!r}"
            for value in values
            if isinstance(value, ast.Constant) and value.value in literals
        ]
    return found


def test_operations_and_plans_take_their_defaults_from_settings() -> None:
    literals = _string_defaults()
    assert {defaults.RUNTIME_BINARY, defaults.CDI_SPEC_PATH, defaults.DROPIN_DIR} <= literals
    files = [
        path
        for folder in ("gpunode", "operations", "facts")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.name != "settings.py"
    ]
    assert [hit for path in files for hit in _literal_defaults(path, literals)] == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpunode_containerd_restart": "sometimes"}, "host-data key 'gpunode_containerd_restart' must be one of"),
        ({"gpunode_nvidia_runtime_binary": "bin/x"}, "host-data key 'gpunode_nvidia_runtime_binary' must be"),
        ({"gpunode_driver_version": 580.10}, "host-data key 'gpunode_driver_version' must be str or null"),
        ({"gpunode_nvidia_runtime": "/x"}, "unknown host-data key 'gpunode_nvidia_runtime'"),
        (
            {"gpunode_containerd_mode": "nri", "gpunode_nvidia_default_runtime": True},
            "host-data key 'gpunode_nvidia_default_runtime' must be false",
        ),
        # Both passed the type check and then failed every node's step that renders them.
        (
            {"gpunode_needrestart_keep": ["containerd.service"]},
            "host-data key 'gpunode_needrestart_keep' must be list[str] of unit names without '.service' "
            "(like 'containerd'), got ['containerd.service']",
        ),
        (
            {"gpunode_unattended_blacklist": ["NVIDIA-"]},
            "host-data key 'gpunode_unattended_blacklist' must be list[str] of package-name prefixes "
            "(lower case, like 'nvidia-'), got ['NVIDIA-']",
        ),
    ],
)
def test_a_bad_value_is_refused_as_validate_refuses_it(data: dict[str, Any], message: str) -> None:
    with pytest.raises(HostDataError) as refused:
        settings(data)
    with pytest.raises(HostDataError) as validated:
        validate(data)
    assert str(refused.value) == str(validated.value)
    assert str(refused.value).startswith(message)


def test_settings_are_frozen() -> None:
    found = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.runtime.binary = "/x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.runtime = found.runtime  # type: ignore[misc]


def test_world_writable_paths_are_warned_about_from_settings_as_from_values() -> None:
    data = {"gpunode_nvidia_runtime_binary": "/tmp/runtime", "gpunode_cdi_spec_dirs": ["/etc/cdi", "/dev/shm/cdi"]}
    warnings = world_writable_warnings(settings(data))
    assert warnings == world_writable_warnings(validate(data))
    assert len(warnings) == 2


def test_the_rollout_keys_come_from_every_host_and_must_agree() -> None:
    assert rollout_settings([]) == RolloutSettings()
    assert rollout_settings([{}, {"gpunode_rollout_batch": 1}]) == RolloutSettings()
    same = {"gpunode_rollout_batch": "50%", "gpunode_rollout_canary": 1, "gpunode_rollout_before": ["x"]}
    assert rollout_settings([same, dict(same, gpunode_rollout_before=[])]) == RolloutSettings(batch="50%", canary=1)
    with pytest.raises(HostDataError, match="host-data key 'gpunode_rollout_max_failed' differs between hosts"):
        rollout_settings([{}, {"gpunode_rollout_max_failed": 1}])


def _run(*hosts: Any, **group: Any) -> tuple[Inventory, State]:
    inventory = Inventory((list(hosts), group))
    return inventory, State(inventory, Config())


def test_the_run_takes_one_rollout_policy_from_the_inventory() -> None:
    _, run = _run("node1", "node2", "node3", gpunode_rollout_order=["node3"], gpunode_rollout_batch=2)
    assert _rollout_policy(run) == RolloutPolicy(("node3", "node1", "node2"), 2, 0, 0)
    _, run = _run("node1", ("node2", {"gpunode_rollout_canary": 1}))
    with pytest.raises(HostDataError, match="'gpunode_rollout_canary' differs between hosts"):
        _rollout_policy(run)


def test_a_hosts_settings_have_their_hooks_checked_and_the_runtime_arguments(tmp_path: Path) -> None:
    inventory, run = _run(
        ("node1", {"gpunode_rollout_before": ["true", "{node}"], "gpunode_nvidia_runtime_binary": "/opt/rt"}),
        "node2",
    )
    with ctx_state.use(run), ctx_host.use(inventory.get_host("node1")):
        found = host_settings()
    assert found.hooks.before == ["true", "{node}"]
    assert found.hooks.after == []
    assert _runtime(found) == {
        "binary": "/opt/rt",
        "systemd_cgroup": None,
        "default_runtime": False,
        "cdi_spec_dirs": None,
        "dropin_dir": defaults.DROPIN_DIR,
        "binary_required": False,
        "enable_cdi": None,
        "handler": "nvidia",
        "mode": "runtime",
        "enable_nri": None,
    }
    inventory, run = _run(("node1", {"gpunode_rollout_after": ["no-such-program-here"]}))
    with (
        ctx_state.use(run),
        ctx_host.use(inventory.get_host("node1")),
        pytest.raises(HostDataError, match="'gpunode_rollout_after': program 'no-such-program-here' is not found"),
    ):
        host_settings()
