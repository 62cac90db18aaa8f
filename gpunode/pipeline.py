"""The deploys' building blocks as pyinfra ``@deploy`` functions, driven by validated host data.

From the CLI the deploy files call them; from Python::

    add_deploy(state, gpu_node_prepared)
    run_ops(state)
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from pyinfra import host
from pyinfra.api import State, deploy

from pyinfra_gpunode.driver_plan import DriverRequest, DriverRequestError, check_request, resolve_source
from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.containerd import ContainerdNodeState
from pyinfra_gpunode.facts.nvidia import NodeKind, NvidiaDriver
from pyinfra_gpunode.facts.operator import GpuOperatorInfo, GpuOperatorState
from pyinfra_gpunode.hooks import HOOK_KEYS, check_hook
from pyinfra_gpunode.hostdata import KEYS, HostDataError, validate, world_writable_warnings
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import (
    cdi,
    distribution,
    hostdata,
    kernel,
    nvidia,
    operator,
    platform,
    rollout,
    unattended_upgrades,
)
from pyinfra_gpunode.operations._internals import current_state
from pyinfra_gpunode.operations._lock import lock_changes
from pyinfra_gpunode.operations._shared import node_fact, snapshot_binary
from pyinfra_gpunode.operator import (
    DRIVER_OFF,
    DRIVER_ROOT,
    config_texts,
    container_userspace,
    driver_from_container,
    operator_runtime,
    runtime_refusal,
    runtime_writers,
    take_over_note,
)
from pyinfra_gpunode.rollout import NodeReport, NodeSettings, RolloutPolicy, rollout_order
from pyinfra_gpunode.toolkit_plan import ToolkitRequestError, check_toolkit


def settings() -> dict[str, Any]:
    """This host's validated host data, with the rollout's policy checked against the inventory."""
    values = validate(host.data.dict())
    for key in HOOK_KEYS:
        values[key] = check_hook(key, values[key], shutil.which)
    values["rollout_policy"] = _rollout_policy(current_state())
    return values


# Per run (State): the rollout's policy, worked out once from the whole inventory, not once per host.
_ROLLOUT_POLICIES: weakref.WeakKeyDictionary[State, RolloutPolicy] = weakref.WeakKeyDictionary()
# The host-data keys of the whole rollout: one value for every host.
RUN_WIDE_KEYS = (
    "gpunode_rollout_order",
    "gpunode_rollout_batch",
    "gpunode_rollout_canary",
    "gpunode_rollout_max_failed",
)


def _rollout_policy(run: State) -> RolloutPolicy:
    if run not in _ROLLOUT_POLICIES:
        inventory = list(run.inventory)
        values = {}
        for key in RUN_WIDE_KEYS:
            default = KEYS[key].default
            seen = {repr(other.data.get(key, default)) for other in inventory}
            if len(seen) > 1:
                raise HostDataError(f"host-data key {key!r} differs between hosts; set it once for all")
            values[key] = inventory[0].data.get(key, default) if inventory else default
        order = rollout_order([other.name for other in inventory], list(values["gpunode_rollout_order"]))
        _ROLLOUT_POLICIES[run] = RolloutPolicy(
            tuple(order),
            values["gpunode_rollout_batch"],
            values["gpunode_rollout_canary"],
            values["gpunode_rollout_max_failed"],
        )
    return _ROLLOUT_POLICIES[run]


def _runtime(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "binary": values["gpunode_nvidia_runtime_binary"],
        "systemd_cgroup": values["gpunode_nvidia_systemd_cgroup"],
        "default_runtime": values["gpunode_nvidia_default_runtime"],
        "cdi_spec_dirs": values["gpunode_cdi_spec_dirs"],
        "dropin_dir": values["gpunode_containerd_dropin_dir"],
        "binary_required": values["gpunode_runtime_binary_required"],
        "enable_cdi": values["gpunode_enable_cdi"],
        "handler": values["gpunode_runtime_handler"],
        "mode": values["gpunode_containerd_mode"],
        "enable_nri": values["gpunode_enable_nri"],
    }


def _locked(values: dict[str, Any]) -> None:
    """The node lock before this run's first change to a live node (an image or chroot,
    ``gpunode_containerd_restart: none``, is not locked)."""
    if values["gpunode_containerd_restart"] == "rolling":
        lock_changes()


# Per run (State): the nodes whose driver changes in their rollout turn: the planned changes and
# the steps that make them (the driver, then the GPU steps after it).
_DRIVER_TURNS: weakref.WeakKeyDictionary[State, dict[str, tuple[list[str], Callable[[], None]]]] = (
    weakref.WeakKeyDictionary()
)

# Per run (State): every node's own rollout settings, added as each host's deploy runs (at prepare,
# so complete before the rollout executes); hosts whose data was refused are not in it.
_NODES: weakref.WeakKeyDictionary[State, dict[str, NodeSettings]] = weakref.WeakKeyDictionary()


@deploy("Register the nvidia runtime with containerd")
def nvidia_runtime_registered(values: dict[str, Any] | None = None) -> None:
    """
    Register the nvidia runtime with containerd, each node with its own host data. With
    ``gpunode_containerd_restart: rolling`` each node's files are written at its turn and
    containerd restarted and verified one node at a time, in rollout order, halting at the
    first failure; with ``none`` files are only written. A live node is locked for the run.
    ``values``: this host's ``settings()`` when the caller has them already. A node whose host
    data is refused, or whose containerd a platform owns (k3s, RKE2, k0s, EKS nodeadm), fails
    with the reason before anything runs on it.
    """
    try:
        _register(values)
    finally:
        _arrived()


def _register(values: dict[str, Any] | None) -> None:
    checked = values is not None  # by gpu_node_prepared, with the GPU layers
    values = values or _accepted_settings(gpu=False)
    if values is None or _platform_refused() or (not checked and _operator_refused(values, gpu=False)):
        return
    nodes = _NODES.setdefault(current_state(), {})
    driver, steps = _DRIVER_TURNS.get(current_state(), {}).get(host.name, ([], None))
    nodes[host.name] = {
        "runtime": _runtime(values),
        "timeout": values["gpunode_restart_timeout"],
        "restart": values["gpunode_containerd_restart"],
        "before": values["gpunode_rollout_before"],
        "after": values["gpunode_rollout_after"],
        "hook_timeout": values["gpunode_hook_timeout"],
        "driver": driver,
        "steps": steps,
    }
    _locked(values)
    policy: RolloutPolicy = values["rollout_policy"]
    rollout.nvidia_runtime_rolled_out(
        name="containerd: nvidia runtime rolled out in turns",
        order=list(policy.order),
        nodes=nodes,
        batch=policy.batch,
        canary=policy.canary,
        max_failed=policy.max_failed,
        _serial=True,
    )
    rollout.node_unlocked(name="node: lock released")


# Per run (State): the hosts whose deploy added its steps (at prepare), and whether the rollout's plan was printed.
_ARRIVED: weakref.WeakKeyDictionary[State, set[str]] = weakref.WeakKeyDictionary()
_PLAN_PRINTED: weakref.WeakSet[State] = weakref.WeakSet()


def _arrived() -> None:
    """This host's deploy has added its steps; once every host's has (hosts prepare in parallel), a dry
    run prints the rollout's groups in order from the nodes' plans."""
    run = current_state()
    if run.is_executing or run in _PLAN_PRINTED:
        return
    arrived = _ARRIVED.setdefault(run, set())
    arrived.add(host.name)
    if {other.name for other in run.inventory.get_active_hosts()} <= arrived:
        _PLAN_PRINTED.add(run)
        try:
            policy = _rollout_policy(run)
        except HostDataError:
            return  # every host was refused, naming the key
        rollout.planned_rollout(run, policy)


def _platform_refused() -> bool:
    """Whether a platform (k3s, RKE2, k0s, EKS nodeadm) owns the node's containerd; the node is then
    set to fail with the reason and what to do instead, before anything changes on it."""
    if platform.platform_problem() is None:
        return False
    platform.supported(name="containerd: not owned by a platform")
    return True


def _operator_refused(values: dict[str, Any], gpu: bool = True) -> bool:
    """Whether the deploy would fight the GPU Operator on this node: its toolkit manages the nvidia
    runtime (unless ``gpunode_take_over_runtime``), or (with ``gpu``) driver packages are asked for
    where its driver container provides the driver. The node is then set to fail with the reason
    and the Helm value to change, before anything changes on it; else the plan says who owns what."""
    found = node_fact(GpuOperatorState)
    node = node_fact(ContainerdNodeState, binary=values["gpunode_nvidia_runtime_binary"])
    notes, refusal = [], ""
    managed = operator_runtime(runtime_writers(config_texts(node["files"], found), "nvidia", found), found)
    if managed and not values["gpunode_take_over_runtime"]:
        refusal = "containerd config not changed: " + runtime_refusal(managed)
    elif managed:
        notes.append(take_over_note(managed))
    if gpu:
        driver = node_fact(NvidiaDriver)
        if driver_from_container(driver, found):
            source, _ = resolve_source(
                values["gpunode_driver_source"], check_request(_driver_request(values)), driver["kernel_module_version"]
            )
            if source == "packages" and not refusal:
                refusal = (
                    f"NVIDIA driver not changed: the driver {driver['kernel_module_version']} comes from the GPU "
                    f"Operator's driver container ({DRIVER_ROOT}); installing driver packages would put a second "
                    f"driver beside it. Set `{DRIVER_OFF}` in the operator's Helm values and drain the node first, "
                    "or leave gpunode_driver_branch and gpunode_driver_version unset to keep its driver"
                )
            notes.append(_container_driver(driver["kernel_module_version"], found))
    if not refusal and not notes:
        return False
    operator.handed_over(name="GPU Operator: host side handed over", refusal=refusal, notes=notes)
    return bool(refusal)


def _container_driver(loaded: str | None, found: GpuOperatorInfo) -> str:
    return (
        f"driver {loaded} from the GPU Operator's driver container ({DRIVER_ROOT}, userspace "
        f"{container_userspace(found) or 'unknown'}): driver packages untouched"
    )


def _report() -> NodeReport:
    return rollout.REPORTS.setdefault(current_state(), {}).setdefault(host.name, NodeReport())


def _driver_request(values: dict[str, Any]) -> DriverRequest:
    return DriverRequest(
        values["gpunode_driver_branch"],
        values["gpunode_driver_version"],
        values["gpunode_driver_flavor"],
        values["gpunode_allow_dkms"],
        values["gpunode_mok_enrolled"],
    )


def _accepted_settings(gpu: bool = True) -> dict[str, Any] | None:
    """This host's settings (with ``gpu``, the driver and toolkit keys checked too); None once the
    host is set to fail with the reason (naming the key), so that nothing runs on it and a dry run
    prints the reason as its plan."""
    values, error = _checked_settings(gpu)
    if values is None:
        hostdata.accepted(name="host data: accepted", error=error)
    return values


def _checked_settings(gpu: bool = True) -> tuple[dict[str, Any] | None, str]:
    """``(settings, "")``, or ``(None, why they were refused)``; the node's snapshots then check for
    the runtime binary its host data names."""
    try:
        values = settings()
        if gpu:
            check_request(_driver_request(values))
            check_toolkit(
                values["gpunode_toolkit_source"], values["gpunode_toolkit_version"], values["gpunode_toolkit_deb_dir"]
            )
    except (DriverRequestError, ToolkitRequestError) as exc:
        prefix = "driver" if isinstance(exc, DriverRequestError) else "toolkit"
        error = f"host-data key 'gpunode_{prefix}_{exc.argument}': {exc}"
    except HostDataError as exc:
        error = str(exc)
    else:
        for warning in world_writable_warnings(values):
            logger.warning("%s%s", host.print_prefix, warning)
        snapshot_binary(values["gpunode_nvidia_runtime_binary"])
        return values, ""
    return None, error


def _preinstalled(values: dict[str, Any]) -> bool:
    """Whether this node keeps its own driver (read before any step; the driver step changes nothing then)."""
    loaded = node_fact(NvidiaDriver)["kernel_module_version"]
    source, _ = resolve_source(values["gpunode_driver_source"], check_request(_driver_request(values)), loaded)
    return source == "preinstalled"


def _driver_ready(values: dict[str, Any]) -> bool:
    """``_if`` of the GPU steps after the driver: false (and reported) while a reboot is pending."""
    report = _report()
    if report.driver_ready is None:
        driver = node_fact(NvidiaDriver)
        loaded, userspace = driver["kernel_module_version"], driver["userspace_version"]
        report.driver_ready = bool(loaded and userspace and not driver["mismatch"])
        source, _ = resolve_source(values["gpunode_driver_source"], check_request(_driver_request(values)), loaded)
        found = node_fact(GpuOperatorState)
        container = driver_from_container(driver, found)
        if source == "preinstalled" and not container:
            report.skipped.append(f"driver {loaded} ({driver['module_flavor'] or 'unknown flavour'}) preinstalled")
        if container:
            userspace = container_userspace(found)
            report.driver_ready = bool(loaded and userspace and same_driver(loaded, userspace))
            report.skipped.append(_container_driver(loaded, found))
            if not report.driver_ready:
                report.pending.append(f"driver container: module {loaded}, its userspace {userspace or 'unknown'}")
                report.skipped.append("Fabric Manager, toolkit, CDI: the driver container's driver is not ready")
        elif loaded and not userspace:
            report.pending.append(f"driver {loaded} loaded, but the loader finds no libnvidia-ml.so.1")
            report.skipped.append("Fabric Manager, toolkit, CDI: no NVIDIA userspace library")
            logger.warning(
                "%sno NVIDIA userspace library: Fabric Manager, toolkit and CDI steps skipped", host.print_prefix
            )
        elif not report.driver_ready:
            report.pending.append(f"reboot: driver {userspace or '?'} installed, {loaded or 'no module'} loaded")
            report.skipped.append("Fabric Manager, toolkit, CDI: reboot pending")
            logger.warning("%sreboot pending: Fabric Manager, toolkit and CDI steps skipped", host.print_prefix)
    return report.driver_ready


def _driver_arguments(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": values["gpunode_driver_source"],
        "branch": values["gpunode_driver_branch"],
        "version": values["gpunode_driver_version"],
        "flavor": values["gpunode_driver_flavor"],
        "allow_dkms": values["gpunode_allow_dkms"],
        "mok_enrolled": values["gpunode_mok_enrolled"],
        "reboot": values["gpunode_reboot"],
        "reboot_timeout": values["gpunode_reboot_timeout"],
        "replace_preinstalled": values["gpunode_driver_replace_preinstalled"],
    }


def _toolkit_changes(values: dict[str, Any]) -> list[str]:
    """The toolkit's install or upgrade, a node disruption (its postinst reloads systemd and starts the CDI
    refresh), where the toolkit step will run: the driver loaded and matching its userspace."""
    driver = node_fact(NvidiaDriver)
    if not (driver["kernel_module_version"] and driver["userspace_version"] and not driver["mismatch"]):
        return []
    return nvidia.toolkit_changes(
        source=values["gpunode_toolkit_source"],
        version=values["gpunode_toolkit_version"],
        deb_dir=values["gpunode_toolkit_deb_dir"],
    )


def _downloads(values: dict[str, Any]) -> None:
    """The driver and toolkit packages the node's turn installs, downloaded before any turn, on every node at
    once; a node whose download fails is failed here and takes no turn."""
    arguments = {
        key: value for key, value in _driver_arguments(values).items() if key not in ("reboot", "reboot_timeout")
    }
    nvidia.driver_downloaded(name="NVIDIA driver: packages downloaded before the turns", **arguments)
    nvidia.container_toolkit_downloaded(
        name="NVIDIA Container Toolkit: packages downloaded before the turns",
        source=values["gpunode_toolkit_source"],
        version=values["gpunode_toolkit_version"],
        deb_dir=values["gpunode_toolkit_deb_dir"],
    )


def _gpu_steps(values: dict[str, Any], in_turn: bool = False) -> None:
    """The driver, then (once it is loaded and matches its userspace) Fabric Manager, the toolkit, CDI.
    ``in_turn``: in the node's rollout turn, installing only what ``_downloads`` put in apt's cache."""
    downloaded = nvidia.downloaded_packages(current_state(), host.name) if in_turn else None
    nvidia.driver(
        name="NVIDIA driver: installed and held, or preinstalled", downloaded=downloaded, **_driver_arguments(values)
    )
    ready = partial(_driver_ready, values)
    driver, found = node_fact(NvidiaDriver), node_fact(GpuOperatorState)
    if driver_from_container(driver, found):
        _report().skipped.append(f"Fabric Manager: the GPU Operator's driver container ({DRIVER_ROOT}) runs it")
    else:
        nvidia.fabric_manager(name="Fabric Manager: matches the driver", preinstalled=_preinstalled(values), _if=ready)
    nvidia.container_toolkit(
        name="NVIDIA Container Toolkit: installed and held",
        source=values["gpunode_toolkit_source"],
        version=values["gpunode_toolkit_version"],
        deb_dir=values["gpunode_toolkit_deb_dir"],
        downloaded=downloaded,
        _if=ready,
    )
    cdi.refresh_start_limit(name="CDI refresh: no start limit", _if=ready)
    cdi.spec(
        name="CDI spec: current for the loaded driver",
        path=values["gpunode_cdi_spec_path"],
        owner=values["gpunode_cdi_owner"],
        _if=ready,
    )


@deploy("Prepare a Kubernetes GPU node")
def gpu_node_prepared() -> None:
    """
    Prepare the node in dependency order: kernel held, unattended-upgrades and needrestart,
    nouveau, then on nodes with an NVIDIA GPU the driver (installed from packages, or the
    node's own) and, once it is loaded, Fabric Manager, the container toolkit and the CDI spec;
    last the containerd runtime, rolled out one node at a time, and a per-node summary. A
    driver change (install, upgrade, reboot) is made in the node's rollout turn, with the GPU
    steps after it, between the rollout hooks, and so is a toolkit install or upgrade (its package
    reloads systemd and starts the CDI refresh); their packages are downloaded before the first turn,
    and the turn installs them without downloading. Everything else runs on all nodes at once. A node
    whose host data is refused, or whose containerd a platform owns (k3s, RKE2, k0s, EKS
    nodeadm), fails with the reason before anything runs on it.
    """
    values, error = _checked_settings()
    kind = node_fact(NodeKind)  # distribution and GPUs, with everything else the steps read
    if distribution.refusal(kind["distribution"]["release_meta"]):
        distribution.supported(name="distribution: supported")  # fails the node before any change
        return
    if values is None:
        hostdata.accepted(name="host data: accepted", error=error)
        return
    if _platform_refused() or _operator_refused(values):
        return
    kernel.held(name="kernel: held", present=values["gpunode_kernel_hold"])
    unattended_upgrades.configured(
        name="unattended-upgrades and needrestart: configured",
        mode=values["gpunode_unattended_upgrades"],
        blacklist=values["gpunode_unattended_blacklist"],
        needrestart_keep=values["gpunode_needrestart_keep"],
    )
    kernel.nouveau_blacklisted(name="nouveau: blacklisted")
    if kind["gpus"]["gpus"]:
        changes = nvidia.driver_changes(**_driver_arguments(values)) + _toolkit_changes(values)
        if changes:  # in the node's turn, whatever gpunode_containerd_restart says; downloaded before
            _downloads(values)
            turns = _DRIVER_TURNS.setdefault(current_state(), {})
            turns[host.name] = (changes, partial(_gpu_steps, values, in_turn=True))
        else:
            _gpu_steps(values)
    else:
        _report().skipped.append("driver, Fabric Manager, toolkit, CDI: no NVIDIA GPU")
        logger.info("%sno NVIDIA GPU: driver, Fabric Manager, toolkit and CDI steps skipped", host.print_prefix)
    nvidia_runtime_registered(values=values)
