"""Roll containerd's nvidia runtime config out one node at a time, in a fixed order, halting at a failure."""

from __future__ import annotations

import os
import weakref
from collections.abc import Generator, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pyinfra import host, state
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.facts.server import Hostname

from pyinfra_gpunode.hook_process import hook_failure, run_hook
from pyinfra_gpunode.hooks import hook_argv, hook_environment, node_name_problem, placeholders
from pyinfra_gpunode.log import logger, printable
from pyinfra_gpunode.operations import _lock, containerd, platform
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._internals import (
    changed_operations,
    current_state,
    failed_operation,
    first_failure,
    on_host,
    operation_result,
    outside_operation,
    spawn,
)
from pyinfra_gpunode.operations._shared import read_afresh
from pyinfra_gpunode.rollout import (
    NodeReport,
    NodeSettings,
    node_settings,
    summary_table,
    turn_changes,
    unit_problem,
)

# Per run (State): node name -> "done", "unchanged", "failed: <reason>" or "halted: <reason>".
OUTCOMES: weakref.WeakKeyDictionary[State, dict[str, str]] = weakref.WeakKeyDictionary()
# Per run (State): node name -> what the earlier steps skipped or left pending, for the summary.
REPORTS: weakref.WeakKeyDictionary[State, dict[str, NodeReport]] = weakref.WeakKeyDictionary()


@operation(is_idempotent=False, idempotent_notice="Takes the lock once per run and node.")
def node_locked() -> Generator[Any, Any, None]:
    """
    Hold this node's lock for the rest of the run, so two runs never work on one node at once.

    The lock (``/run/pyinfra-gpunode/node.lock``, ``flock``) is held by a process on the node
    until ``node_unlocked`` ends it or this run's connection closes (the run ends, fails or is
    killed). A second run waits up to 10 seconds, then fails the node naming the holder (run
    id, controlling machine, process, start time). Taken once per run and node however often
    the deploys call it, and renewed when half its hour has passed (a turn hours after the run's
    first change on the node); a dry run does not take it.

    **Example:**

    .. code:: python

        rollout.node_locked(name="node: locked for this run")
    """
    if not state.is_executing:
        host.noop("the node lock is taken when the run executes")
        return
    took = False
    for command in _lock.take():  # nothing while this run holds it, unless its renewal is due
        took = True
        yield command
    if not took:
        host.noop("this run holds the node lock")


@operation(is_idempotent=False, idempotent_notice="Releases the lock this run holds, if any.")
def node_unlocked() -> Generator[Any, Any, None]:
    """
    Release the node lock this run took with ``node_locked``, at the end of its work on the node.

    **Example:**

    .. code:: python

        rollout.node_unlocked(name="node: lock released")
    """
    if not state.is_executing or not _lock.holds(current_state(), host.name):
        host.noop("this run holds no node lock")
        return
    yield from _lock.release()


@operation(is_idempotent=False, idempotent_notice="Writes and restarts only on nodes whose config differs.")
def nvidia_runtime_rolled_out(
    order: list[str], nodes: dict[str, NodeSettings] | None = None
) -> Generator[Any, Any, None]:
    """
    Take every disruptive change node by node in ``order``: a node's turn runs the before-hook,
    its driver change (and reboot) with the GPU steps after it, writes its containerd files,
    restarts and verifies containerd, then runs the after-hook; the next node starts only after
    this one's turn ended. The first failure (a hook that fails, a refused config, a unit that
    cannot be restarted, a driver that is not loaded after the reboot, or a restart that does
    not verify and was rolled back) halts the rollout: later nodes are not touched.

    + order: host names in rollout order (``pyinfra_gpunode.rollout.rollout_order``)
    + nodes: each node's own settings by host name: ``runtime`` (``containerd.nvidia_runtime``
      arguments), ``timeout`` (seconds its restart may take to bring the CRI plugin up),
      ``restart`` (``rolling``, or ``none``: files only, no restart, outside the turns),
      ``before`` and ``after`` (argv run on the controller around the turn, ``{node}`` and
      ``{hostname}`` filled in; ``[]``: none), ``hook_timeout`` (seconds per hook), ``driver``
      (the driver changes planned for the turn, as ``nvidia.driver_changes`` lists them) and
      ``steps`` (a callable adding the driver and GPU operations, called at the turn); a node
      not listed takes the defaults

    Add it with ``_serial=True`` for every host. The first host pyinfra runs it on conducts the
    whole rollout through nested operations (pyinfra takes serial hosts in random order), each
    node with its own settings; every host then reports its own node's outcome, so a failed
    node fails the run with its reason. A node with nothing disruptive to do takes no turn and
    runs no hook. The hooks run on the controller without a shell, with the controller's
    environment plus ``GPUNODE_HOOK``, ``GPUNODE_NODE``, ``GPUNODE_HOSTNAME``,
    ``GPUNODE_CHANGES`` (the turn's planned changes, one a line) and ``GPUNODE_DRIVER_CHANGE``.
    A failed before-hook leaves its node untouched; a turn that failed runs no after-hook (the
    node stays as the before-hook left it, e.g. cordoned). At a node's turn its config tree is
    saved (a tar per turn under ``/var/lib/pyinfra-gpunode/backup``) right before its files
    are written, and a failed restart restores only that. A node whose containerd is not
    active is restarted and verified at its turn. Without ``-y`` the prepare pass prints each
    node's plan, hooks included; hooks never run then.

    **Example:**

    .. code:: python

        rollout.nvidia_runtime_rolled_out(
            name="containerd: nvidia runtime, one node at a time",
            order=["node1", "node2", "node3"],
            nodes={"node3": {"runtime": {"default_runtime": True}, "timeout": 60, "restart": "rolling",
                             "before": ["kubectl", "drain", "{hostname}", "--ignore-daemonsets"]}},
            _serial=True,
        )
    """
    nodes = nodes or {}
    mine = node_settings(nodes, host.name)
    if not state.is_executing:
        yield from _plan(mine)
        return
    if not _takes_turns(mine):
        yield from _files_only(mine["runtime"])
        return
    run = current_state()
    if run not in OUTCOMES:
        _conduct(run, order, nodes)
    outcome = OUTCOMES[run].get(host.name, "not in the rollout order")
    if outcome.startswith(("failed", "not in")):
        yield fail(f"containerd rollout {outcome}")
    else:
        host.noop(f"containerd rollout: {outcome}")


def _takes_turns(settings: NodeSettings) -> bool:
    """Whether the node's disruptive steps wait for its turn: a containerd restart (``rolling``) or a
    driver change (whatever ``gpunode_containerd_restart`` says)."""
    return settings["restart"] == "rolling" or bool(settings["driver"])


def _plan(settings: NodeSettings) -> Generator[Any, Any, None]:
    found = containerd.registration(**settings["runtime"])
    rolling = settings["restart"] == "rolling"
    unit = _unit_problem(found, settings) or _cri_refusal(found, settings)
    changes = turn_changes(settings["driver"], found.writes, found.restart_reason if rolling else None)
    hostname, refused = _hook_hostname(host, settings) if _takes_turns(settings) and changes else ("", None)
    if found.problem or unit or refused:
        logger.warning("%splan: %s", host.print_prefix, found.problem or unit or refused)
    elif not changes and not found.writes:
        if found.note:  # k3s or RKE2 adding nvidia themselves: the plan says so
            logger.info("%splan: %s", host.print_prefix, found.note)
        host.noop(found.note or "containerd runs the nvidia runtime config; nothing disruptive to do")
        return
    else:
        hooks = _plan_hooks(settings, hostname) if _takes_turns(settings) and changes else []
        for line in hooks[:1] + settings["driver"]:
            logger.info("%splan: %s", host.print_prefix, line)
        if found.writes:
            then = "then restart containerd and verify" if rolling else "no restart (gpunode_containerd_restart: none)"
            logger.info("%splan: write %s, %s\n%s", host.print_prefix, ", ".join(found.writes), then, found.diff())
        elif rolling and found.restart_pending and found.platform:
            logger.info("%splan: %s; restart it and verify", host.print_prefix, found.restart_reason)
        elif rolling and found.restart_pending:
            logger.info("%splan: restart containerd (%s) and verify", host.print_prefix, found.restart_reason)
        for line in hooks[1:]:
            logger.info("%splan: %s", host.print_prefix, line)
    yield StringCommand("true")  # marks the change at prepare; at execute the rollout runs instead


def _plan_hooks(settings: NodeSettings, hostname: str) -> list[str]:
    """The turn's before- and after-hook as the plan lists them (never run in a dry run)."""
    lines = []
    for which in ("before", "after"):
        argv = hook_argv(settings[which], host.name, hostname)
        lines.append(f"{which}-hook on the controller: {_shown(argv)}" if argv else f"{which}-hook: none")
    return lines


def _shown(argv: list[str]) -> str:
    return " ".join(repr(arg) if not arg or any(c.isspace() for c in arg) else arg for arg in argv)


def _hook_hostname(node: Host, settings: NodeSettings) -> tuple[str, str | None]:
    """The node's hostname for its hooks, read only when a hook asks for ``{hostname}``, and why it is
    refused (not a Kubernetes node name: it would reach the controller's commands), or ``None``."""
    if any("hostname" in placeholders(arg) for arg in (*settings["before"], *settings["after"])):
        hostname = str(node.get_fact(Hostname))
        refused = node_name_problem(hostname)
        return ("", refused) if refused else (hostname, None)
    return "", None


def _files_only(runtime: dict[str, Any]) -> Generator[Any, Any, None]:
    """A ``restart: none`` node: its files (after a backup), no restart, no turn."""
    if containerd.registration(**runtime).writes:
        yield from containerd.config_backed_up._inner(path=_backup_path())
    yield from containerd.nvidia_runtime._inner(**runtime)


def _backup_path() -> str:
    return f"{containerd.BACKUP_DIR}/containerd-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}.tar"


def _conduct(state: State, order: list[str], nodes: Mapping[str, NodeSettings]) -> None:
    outcomes: dict[str, str] = {}
    OUTCOMES[state] = outcomes
    active = {node.name: node for node in state.inventory.get_active_hosts()}
    settings = {name: node_settings(nodes, name) for name in order if name in active}
    turns = [active[name] for name, mine in settings.items() if _takes_turns(mine)]
    for name, mine in settings.items():
        if not _takes_turns(mine):
            outcomes[name] = "files only (gpunode_containerd_restart: none)"
    # Read every node in parallel first; only nodes with something to do take a (serial) turn.
    checks = {node.name: spawn(state, _check, state, node, settings[node.name]) for node in turns}
    halted_by = None
    for node in turns:
        found = checks[node.name].get()
        mine = settings[node.name]
        unit = _unit_problem(found, mine) or _cri_refusal(found, mine)
        if halted_by:
            outcomes[node.name] = f"halted: not touched after the failure on {halted_by}"
        elif unit:
            outcomes[node.name] = f"failed: {unit}"
        elif not _turn_needed(found, mine):
            outcomes[node.name] = "unchanged"
            if found.note:  # k3s or RKE2 adding nvidia themselves
                logger.info("%s%s", node.print_prefix, found.note)
        else:
            outcomes[node.name] = _turn(state, node, mine, found)
        if not outcomes[node.name].startswith(("unchanged", "halted")):
            logger.info("%scontainerd rollout %s", node.print_prefix, outcomes[node.name])
        if outcomes[node.name].startswith("failed"):
            halted_by = halted_by or node.name
    logger.info("--> Summary (rollout order)\n%s", summary_table(_reports(state, order, outcomes)))


def _unit_problem(found: containerd.Registration, settings: NodeSettings) -> str | None:
    """Why the node's containerd cannot be restarted and verified here (only where it restarts; a k3s or
    RKE2 node restarts its own unit instead)."""
    rolling = settings["restart"] == "rolling"
    owned = found.platform is not None
    return unit_problem(found.service) if rolling and found.installed and not found.problem and not owned else None


def _cri_refusal(found: containerd.Registration, settings: NodeSettings) -> str | None:
    """Why the node may not take its turn: its containerd config as it is now would not start the CRI
    plugin, and the turn would restart containerd into it (no file to write, or a driver change, whose
    reboot comes before the write). A refused candidate config speaks for itself (``found.problem``)."""
    if not found.current_cri_problem or found.problem or not _turn_needed(found, settings):
        return None
    if found.writes and not settings["driver"]:
        return None  # the turn restarts into the written config, judged by the same rules
    return (
        "its containerd config would not start the CRI plugin, so containerd is not restarted into it: "
        + found.current_cri_problem
    )


def _turn_needed(found: containerd.Registration, settings: NodeSettings) -> bool:
    """Whether the node has anything disruptive to do: a refused config (it fails in its turn), files to
    write, a restart due (``rolling`` only) or a driver change."""
    restart = found.restart_pending and settings["restart"] == "rolling"
    return bool(found.problem or found.writes or restart or settings["driver"])


def _check(state: State, node: Host, settings: NodeSettings) -> containerd.Registration:
    """What the node's files and service need (reads only)."""
    with on_host(state, node):
        return containerd.registration(**settings["runtime"])


def _reports(state: State, order: list[str], outcomes: dict[str, str]) -> dict[str, NodeReport]:
    known = REPORTS.get(state, {})
    reports = {}
    for name in order:
        node = state.inventory.get_host(name)
        report = known.get(name, NodeReport())
        report.rollout = outcomes.get(name) or _not_reached(state, node)
        report.changed = sorted({name.rsplit(" | ", 1)[-1] for name in changed_operations(state, node)})
        if report.rollout.startswith("halted"):
            report.pending.append("containerd config and restart: rollout halted")
        reports[name] = report
    return reports


CAUSE_MAX = 240  # characters of a failed step's last stderr line the summary shows


def _not_reached(state: State, node: Host) -> str:
    """A node that failed before the rollout: the step that failed it and its last line on stderr."""
    failed = first_failure(state, node)
    if failed is None:
        return "not reached (failed before the rollout)"
    name, stderr = failed
    lines = stderr.strip().splitlines()
    cause = printable(lines[-1][:CAUSE_MAX]) if lines else "see the log above"
    return f"not reached (failed before the rollout, at {name.rsplit(' | ', 1)[-1]}: {cause})"


def _turn(state: State, node: Host, settings: NodeSettings, found: containerd.Registration) -> str:
    """One node's turn: the node lock, and the node read again under it; before-hook; driver and GPU
    steps; back up, write its files, restart and verify (what it wrote rolled back on failure);
    after-hook. ``found`` is the run's earlier read: the turn decides from its own. Returns the outcome."""
    rolling = settings["restart"] == "rolling"
    did: list[str] = []
    # The conducting host is inside this operation: its nested steps run as if it were not.
    # pyinfra's context manager does not restore the host on an exception: catch inside it.
    with outside_operation(node), on_host(state, node):
        try:
            node_locked(name="node: locked for its turn")  # before the before-hook drains it
        except NestedOperationError as error:
            return f"failed: {_cause(state, node, error)}; the node was not touched"
        read_afresh(state, node.name)  # the node may have changed since the run's read
        found = containerd.registration(**settings["runtime"])
        hooked = not found.problem  # a refused config fails the node at once: no hook, no driver change
        hostname, refused = _hook_hostname(node, settings) if hooked else ("", None)
    unit = _unit_problem(found, settings) or _cri_refusal(found, settings)
    if refused or unit:
        return f"failed: {refused or unit}; the node was not touched"
    if not _turn_needed(found, settings):
        return "unchanged"
    changes = turn_changes(settings["driver"], found.writes, found.restart_reason if rolling else None)
    if hooked and settings["before"]:
        failure = _hook(node, "before", settings, hostname, changes)
        if failure:
            return f"failed: before-hook {failure}; the node was not touched"
        did.append("before-hook")
    with outside_operation(node), on_host(state, node):
        try:
            if hooked and settings["steps"]:
                settings["steps"]()
                did.extend(settings["driver"])  # a reboot among them takes the lock again itself
                found = containerd.registration(**settings["runtime"])  # the steps changed the node
            backup = _backup_path() if found.writes and not found.problem else None  # a refused config: no backup
            if backup:
                containerd.config_backed_up(name="containerd: config backed up", path=backup)
            written = containerd.nvidia_runtime(name="containerd: nvidia runtime registered", **settings["runtime"])
            restarted = (
                platform.unit_restarted(
                    name="containerd: platform unit restarted and verified", timeout=settings["timeout"]
                )
                if rolling and found.platform
                else containerd.restarted_if_pending(
                    name="containerd: restarted and verified",
                    timeout=settings["timeout"],
                    backup=backup if written.did_change() else None,
                    dropped_runtimes=found.dropped_runtimes,
                    backup_cri_problem=found.current_cri_problem,
                )
                if rolling
                else None
            )
        except NestedOperationError as error:
            unrun = "; after-hook not run" if hooked and settings["after"] else ""
            return f"failed: {_cause(state, node, error)}{unrun}"
    if written.did_change():
        did.append("containerd written")
    if restarted and restarted.did_change():
        did.append("containerd restarted and verified")
    if hooked and settings["after"]:
        failure = _hook(node, "after", settings, hostname, changes)
        if failure:
            return f"failed: after-hook {failure}; the node was changed: {', '.join(did)}"
        did.append("after-hook")
    return f"done: {', '.join(did)}" if did else "unchanged"


def _cause(state: State, node: Host, error: NestedOperationError) -> str:
    """The last line the failed nested operation printed on stderr."""
    stderr = operation_result(state, node, failed_operation(error)).stderr.strip()
    return stderr.splitlines()[-1] if stderr else "see the log above"


def _hook(
    node: Host, which: Literal["before", "after"], settings: NodeSettings, hostname: str, changes: list[str]
) -> str | None:
    """Run the node's ``which`` hook on the controller (no shell); ``None`` when it exited 0, else why not.

    Its output is logged line by line as it comes; what it started is ended with it (``hook_process``).
    """
    argv = hook_argv(settings[which], node.name, hostname)
    env = hook_environment(os.environ, which, node.name, hostname, changes)
    logger.info("%s%s-hook: %s", node.print_prefix, which, _shown(argv))
    run = run_hook(argv, env, settings["hook_timeout"], f"{node.print_prefix}{which}-hook")
    return hook_failure(argv[0], settings["hook_timeout"], run)
