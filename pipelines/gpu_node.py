"""The deploys' building blocks as pyinfra ``@deploy`` functions, driven by validated host data.

From the CLI the deploy files call them; from Python::

    add_deploy(state, gpu_node_prepared)
    run_ops(state)
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from pyinfra import host
from pyinfra.api import State, deploy

from pyinfra_gpunode.driver_plan import DriverRequestError, requested
from pyinfra_gpunode.driver_skew import skew_warnings
from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.containerd import ContainerdNodeState
from pyinfra_gpunode.facts.driver import NvidiaDriver, NvidiaHostState
from pyinfra_gpunode.facts.node import NodeKind
from pyinfra_gpunode.facts.operator import GpuOperatorInfo, GpuOperatorState
from pyinfra_gpunode.hooks import HOOK_KEYS, check_hook
from pyinfra_gpunode.hostdata import HostDataError, rollout_settings, world_writable_warnings
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import (
    cdi,
    converged,
    distribution,
    driver,
    fabric_manager,
    hostdata,
    kernel,
    operator,
    persistence,
    platform,
    rollout,
    toolkit,
    unattended_upgrades,
)
from pyinfra_gpunode.operations._internals import current_state, prepared_kept
from pyinfra_gpunode.operations._lock import lock_changes
from pyinfra_gpunode.operations._packages import downloaded_packages
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.operations._shared import node_fact, snapshot_binary
from pyinfra_gpunode.operations.converged import Step
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
from pyinfra_gpunode.pipelines._boundary import node_boundary
from pyinfra_gpunode.pipelines._settings import validated_settings
from pyinfra_gpunode.platform import requests_of
from pyinfra_gpunode.rollout import NodeReport, RolloutPolicy, rollout_order
from pyinfra_gpunode.settings import Settings
from pyinfra_gpunode.toolkit_plan import ToolkitRequestError, check_toolkit


def host_settings() -> Settings:
    """This host's validated host data, its hooks checked on the controller, with the rollout's
    policy checked against the inventory."""
    found = validated_settings()
    before_key, after_key = HOOK_KEYS
    hooks = replace(
        found.hooks,
        before=check_hook(before_key, found.hooks.before, shutil.which),
        after=check_hook(after_key, found.hooks.after, shutil.which),
    )
    _rollout_policy(current_state())  # refused unless every host gives the run-wide keys one value
    return replace(found, hooks=hooks)


def _rollout_policy(run: State) -> RolloutPolicy:
    """The rollout's policy, worked out once per run from the whole inventory, not once per host."""
    found = run_state(run)
    if found.rollout_policy is None:
        inventory = list(run.inventory)
        rollout = rollout_settings([other.data.dict() for other in inventory])
        order = rollout_order([other.name for other in inventory], list(rollout.order))
        found.rollout_policy = RolloutPolicy(tuple(order), rollout.batch, rollout.canary, rollout.max_failed)
    return found.rollout_policy


def _runtime(settings: Settings) -> dict[str, Any]:
    """``containerd.nvidia_runtime``'s arguments."""
    containerd, runtime = settings.containerd, settings.runtime
    return {
        "binary": runtime.binary,
        "systemd_cgroup": runtime.systemd_cgroup,
        "default_runtime": runtime.default_runtime,
        "cdi_spec_dirs": containerd.cdi_spec_dirs,
        "dropin_dir": containerd.dropin_dir,
        "binary_required": runtime.binary_required,
        "enable_cdi": containerd.enable_cdi,
        "handler": runtime.handler,
        "mode": containerd.mode,
        "enable_nri": containerd.enable_nri,
    }


def _locked(settings: Settings) -> None:
    """The node lock before this run's first change to a live node (an image or chroot,
    ``gpunode_containerd_restart: none``, is not locked)."""
    if settings.containerd.restart == "rolling":
        lock_changes()


@deploy("Register the nvidia runtime with containerd")
def nvidia_runtime_registered(settings: Settings | None = None) -> None:
    """
    Register the nvidia runtime with containerd, each node with its own host data. With
    ``gpunode_containerd_restart: rolling`` each node's files are written at its turn and
    containerd restarted and verified one node at a time, in rollout order, halting at the
    first failure; with ``none`` files are only written. A live node is locked for the run.
    ``settings``: this host's ``host_settings()`` when the caller has them already. A node whose host
    data is refused, or whose containerd a platform owns (k3s, RKE2, k0s, EKS nodeadm), fails
    with the reason before anything runs on it.
    """
    try:
        with node_boundary("the containerd runtime"):
            _register(settings)
    finally:
        _arrived()
        prepared_kept()


def _register(settings: Settings | None) -> None:
    checked = settings is not None  # by gpu_node_prepared, with the GPU layers
    settings = settings or _accepted_settings(gpu=False)
    if settings is None or _platform_refused(settings) or (not checked and _operator_refused(settings, gpu=False)):
        return
    nodes = run_state(current_state()).nodes  # complete before the rollout executes (added at prepare)
    changes, versions, steps = run_state(current_state()).driver_turns.get(host.name, ([], ("", ""), None))
    nodes[host.name] = {
        "runtime": _runtime(settings),
        "timeout": settings.containerd.restart_timeout,
        "restart": settings.containerd.restart,
        "before": settings.hooks.before,
        "after": settings.hooks.after,
        "hook_timeout": settings.hooks.timeout,
        "node_name": settings.hooks.node_name,
        "driver": changes,
        "driver_versions": versions,
        "steps": steps,
    }
    _locked(settings)
    policy = _rollout_policy(current_state())
    rollout.nvidia_runtime_rolled_out(
        name="containerd: nvidia runtime rolled out in turns",
        order=policy.order,  # one tuple for every node: pyinfra keeps each node's arguments for the run
        nodes=nodes,
        batch=policy.batch,
        canary=policy.canary,
        max_failed=policy.max_failed,
        _serial=True,
    )  # which releases the node lock at its end


def _arrived() -> None:
    """This host's deploy has added its steps; once every host's has (hosts prepare in parallel), a dry
    run prints the rollout's groups in order from the nodes' plans."""
    run = current_state()
    found = run_state(run)
    if run.is_executing or found.plan_printed:
        return
    found.arrived.add(host.name)
    if len(found.arrived) < run.inventory.len_active_hosts():  # not all yet, without a walk of the inventory
        return
    if {other.name for other in run.inventory.get_active_hosts()} <= found.arrived:
        found.plan_printed = True
        try:
            policy = _rollout_policy(run)
        except HostDataError:
            return  # every host was refused, naming the key
        rollout.planned_rollout(run, policy)


def _platform_refused(settings: Settings) -> bool:
    """Whether a platform (k3s, RKE2, k0s, EKS nodeadm) owns the node's containerd, or (k3s, RKE2) leaves
    host data unapplied; the node is then set to fail with the reason and what to do instead, before
    anything changes on it."""
    requests = requests_of(_runtime(settings))
    if platform.platform_problem(requests) is None:
        return False
    platform.supported(name="containerd: not owned by a platform", requests=requests)
    return True


def _operator_refused(settings: Settings, gpu: bool = True) -> bool:
    """Whether the deploy would fight the GPU Operator on this node: its toolkit manages the nvidia
    runtime (unless ``gpunode_take_over_runtime``), or (with ``gpu``) driver packages are asked for
    where its driver container provides the driver. The node is then set to fail with the reason
    and the Helm value to change, before anything changes on it; else the plan says who owns what."""
    found = node_fact(GpuOperatorState)
    node = node_fact(ContainerdNodeState, binary=settings.runtime.binary)
    notes, refusal = [], ""
    managed = operator_runtime(runtime_writers(config_texts(node["files"], found), "nvidia", found), found)
    if managed and not settings.runtime.take_over:
        refusal = "containerd config not changed: " + runtime_refusal(managed)
    elif managed:
        notes.append(take_over_note(managed))
    if gpu:
        driver_info = node_fact(NvidiaDriver)
        if driver_from_container(driver_info, found):
            if driver.decision(settings.driver, planned=False).source == "packages" and not refusal:
                refusal = (
                    f"NVIDIA driver not changed: the driver {driver_info['kernel_module_version']} comes from the GPU "
                    f"Operator's driver container ({DRIVER_ROOT}); installing driver packages would put a second "
                    f"driver beside it. Set `{DRIVER_OFF}` in the operator's Helm values and drain the node first, "
                    "or leave gpunode_driver_branch and gpunode_driver_version unset to keep its driver"
                )
            notes.append(_container_driver(driver_info["kernel_module_version"], found))
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
    return run_state(current_state()).reports.setdefault(host.name, NodeReport())


def _accepted_settings(gpu: bool = True) -> Settings | None:
    """This host's settings (with ``gpu``, the driver and toolkit keys checked too); None once the
    host is set to fail with the reason (naming the key), so that nothing runs on it and a dry run
    prints the reason as its plan."""
    settings, error = _checked_settings(gpu)
    if settings is None:
        hostdata.accepted(name="host data: accepted", error=error)
    return settings


def _checked_settings(gpu: bool = True) -> tuple[Settings | None, str]:
    """``(settings, "")``, or ``(None, why they were refused)``; the node's snapshots then check for
    the runtime binary its host data names."""
    try:
        settings = host_settings()
        if gpu:
            requested(settings.driver)
            check_toolkit(settings.toolkit.source, settings.toolkit.version, settings.toolkit.deb_dir)
    except (DriverRequestError, ToolkitRequestError) as exc:
        prefix = "driver" if isinstance(exc, DriverRequestError) else "toolkit"
        error = f"host-data key 'gpunode_{prefix}_{exc.argument}': {exc}"
    except HostDataError as exc:
        error = str(exc)
    else:
        for warning in world_writable_warnings(settings):
            logger.warning("%s%s", host.print_prefix, warning)
        snapshot_binary(settings.runtime.binary)
        return settings, ""
    return None, error


def _driver_skew_warned() -> None:
    """The plan says where the driver works now but is out of step (no driver change is planned to mend
    it): the nvidia module will not load, or not match, once the node boots its next kernel; the userspace
    libraries are of two driver versions. The summary lists each as pending."""
    for what, warning in skew_warnings(node_fact(NvidiaHostState)):
        logger.warning("%splan: %s", host.print_prefix, warning)
        _report().pending.append(f"{what}: {warning}")


def _preinstalled(settings: Settings) -> bool:
    """Whether this node keeps its own driver (read before any step; the driver step changes nothing then)."""
    return driver.decision(settings.driver, planned=False).source == "preinstalled"


def _driver_ready(settings: Settings) -> bool:
    """``_if`` of the GPU steps after the driver: false (and reported) while a reboot is pending."""
    report = _report()
    if report.driver_ready is None:
        decided = driver.decision(settings.driver, planned=False)
        driver_info = decided.loaded
        loaded, userspace = driver_info["kernel_module_version"], driver_info["userspace_version"]
        report.driver_ready = bool(loaded and userspace and not driver_info["mismatch"])
        found = node_fact(GpuOperatorState)
        container = driver_from_container(driver_info, found)
        if decided.source == "preinstalled" and not container:
            report.skipped.append(f"driver {loaded} ({driver_info['module_flavor'] or 'unknown flavour'}) preinstalled")
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


def _driver_arguments(settings: Settings) -> dict[str, Any]:
    """``driver.driver``'s arguments: the driver settings by their own names (persistence mode has its own
    step)."""
    return {key: value for key, value in asdict(settings.driver).items() if key != "persistence_mode"}


def _toolkit_arguments(settings: Settings) -> dict[str, Any]:
    """``toolkit.container_toolkit``'s arguments (``source``, ``version``, ``deb_dir``)."""
    return asdict(settings.toolkit)


def _toolkit_changes(settings: Settings) -> list[str]:
    """The toolkit's install or upgrade, a node disruption (its postinst reloads systemd and starts the CDI
    refresh), where the toolkit step will run: the driver loaded and matching its userspace."""
    driver_info = node_fact(NvidiaDriver)
    if not (driver_info["kernel_module_version"] and driver_info["userspace_version"] and not driver_info["mismatch"]):
        return []
    return toolkit.toolkit_changes(**_toolkit_arguments(settings))


def _downloads(settings: Settings) -> None:
    """The driver and toolkit packages the node's turn installs, downloaded before any turn, on every node at
    once; a node whose download fails is failed here and takes no turn."""
    arguments = {
        key: value for key, value in _driver_arguments(settings).items() if key not in ("reboot", "reboot_timeout")
    }
    driver.driver_downloaded(name="NVIDIA driver: packages downloaded before the turns", **arguments)
    toolkit.container_toolkit_downloaded(
        name="NVIDIA Container Toolkit: packages downloaded before the turns", **_toolkit_arguments(settings)
    )


def _gpu_steps(settings: Settings, in_turn: bool = False) -> None:
    """The driver, then (once it is loaded and matches its userspace) Fabric Manager, the toolkit, CDI.
    ``in_turn``: in the node's rollout turn, installing only what ``_downloads`` put in apt's cache."""
    downloaded = downloaded_packages(current_state(), host.name) if in_turn else None
    ready = partial(_driver_ready, settings)
    driver_step = Step(
        driver.driver,
        "NVIDIA driver: installed and held, or preinstalled",
        {"downloaded": downloaded, **_driver_arguments(settings)},
    )
    group = [driver_step]
    if in_turn:  # the driver changes now: what follows is decided from the node it leaves
        converged.taken(group)
        group = []
    driver_info, found = node_fact(NvidiaDriver), node_fact(GpuOperatorState)
    if driver_from_container(driver_info, found):
        _report().skipped.append(f"Fabric Manager: the GPU Operator's driver container ({DRIVER_ROOT}) runs it")
    else:
        group += [
            Step(
                fabric_manager.fabric_manager,
                "Fabric Manager: matches the driver",
                {"preinstalled": _preinstalled(settings)},
                ready,
            ),
            Step(
                persistence.persistence_mode,
                "NVIDIA persistence mode: as asked",
                {"mode": settings.driver.persistence_mode},
                ready,
            ),
        ]
    group += [
        Step(
            toolkit.container_toolkit,
            "NVIDIA Container Toolkit: installed and held",
            {**_toolkit_arguments(settings), "downloaded": downloaded},
            ready,
        ),
        Step(cdi.refresh_start_limit, "CDI refresh: no start limit", {}, ready),
        Step(
            cdi.spec,
            "CDI spec: current for the loaded driver",
            {"path": settings.cdi.spec_path, "owner": settings.cdi.owner},
            ready,
        ),
    ]
    converged.taken(group)


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
    nodeadm), fails with the reason before anything runs on it; so does a node whose data no check
    foresaw (the others are planned and run).
    """
    with node_boundary("the GPU node"):
        _prepare()
    _arrived()  # a node failed before its rollout step still counts as arrived for the plan
    prepared_kept()


def _prepare() -> None:
    settings, error = _checked_settings()
    kind = node_fact(NodeKind)  # distribution and GPUs, with everything else the steps read
    if distribution.refusal(kind["distribution"]["release_meta"]):
        distribution.supported(name="distribution: supported")  # fails the node before any change
        return
    if settings is None:
        hostdata.accepted(name="host data: accepted", error=error)
        return
    if _platform_refused(settings) or _operator_refused(settings):
        return
    updates = settings.updates
    converged.taken(
        [
            Step(kernel.held, "kernel: held", {"present": updates.kernel_hold}),
            Step(
                unattended_upgrades.configured,
                "unattended-upgrades and needrestart: configured",
                {
                    "mode": updates.unattended,
                    "blacklist": updates.blacklist,
                    "needrestart_keep": updates.needrestart_keep,
                },
            ),
            Step(kernel.nouveau_blacklisted, "nouveau: blacklisted"),
        ]
    )
    if kind["gpus"]["gpus"]:
        changes, versions = driver.driver_changes(**_driver_arguments(settings))
        changes += _toolkit_changes(settings)
        if changes:  # in the node's turn, whatever gpunode_containerd_restart says; downloaded before
            _downloads(settings)
            turns = run_state(current_state()).driver_turns
            turns[host.name] = (changes, versions, partial(_gpu_steps, settings, in_turn=True))
        else:
            _driver_skew_warned()
            _gpu_steps(settings)
    else:
        _report().skipped.append("driver, Fabric Manager, toolkit, CDI: no NVIDIA GPU")
        logger.info("%sno NVIDIA GPU: driver, Fabric Manager, toolkit and CDI steps skipped", host.print_prefix)
    with node_boundary("the containerd runtime"):  # nvidia_runtime_registered's steps, without a nested deploy
        _register(settings)
