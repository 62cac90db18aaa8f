"""Roll containerd's nvidia runtime config out one node at a time, in a fixed order, halting at a failure."""

from __future__ import annotations

import os
import socket
import uuid
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import containerd
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.rollout import NodeReport, NodeSettings, node_settings, summary_table, unit_problem

# Per run (State): node name -> "done", "unchanged", "failed: <reason>" or "halted: <reason>".
OUTCOMES: weakref.WeakKeyDictionary[State, dict[str, str]] = weakref.WeakKeyDictionary()
# Per run (State): node name -> what the earlier steps skipped or left pending, for the summary.
REPORTS: weakref.WeakKeyDictionary[State, dict[str, NodeReport]] = weakref.WeakKeyDictionary()
# Per run (State): who this run is, as the node lock names its holder; the nodes it holds.
_HOLDERS: weakref.WeakKeyDictionary[State, str] = weakref.WeakKeyDictionary()
_LOCKED: weakref.WeakKeyDictionary[State, set[str]] = weakref.WeakKeyDictionary()

LOCK = "/run/lock/pyinfra-gpunode.lock"

# Hold LOCK in a background process (its first line names the holder, the second is the process)
# for as long as this connection lives (the nearest ancestor that is not a shell, sudo or chroot:
# sshd's session, or pyinfra itself for @chroot/@local) or until node_unlocked ends it, waiting up
# to 10 s for a run that just ended.
_TAKE_LOCK = (
    'mkdir -p "$(dirname "$1")" && p=$PPID; '
    'while c=$(cat /proc/$p/comm 2>/dev/null); do case "$c" in sh|bash|dash|sudo|su|doas|chroot|env|timeout) '
    "p=$(cut -d' ' -f4 /proc/$p/stat);; *) break;; esac; done; "
    "sh -c 'exec 9<>\"$1\" && flock -w 10 9 && printf \"%s\\n%s\\n\" \"$2\" \"$$\" > \"$1\" && "
    "while kill -0 \"$3\" 2>/dev/null; do sleep 1 9>&-; done' gpunode-lock \"$1\" \"$2\" \"$p\" "
    "</dev/null >/dev/null 2>&1 & w=$!; "
    'i=0; while [ "$i" -lt 150 ]; do [ "$(head -n 1 "$1" 2>/dev/null)" = "$2" ] && exit 0; '
    'kill -0 "$w" 2>/dev/null || break; sleep 0.1; i=$((i + 1)); done; '
    'echo "another run holds the node lock $1: $(head -n 1 "$1" 2>/dev/null)" >&2; exit 1'
)
# End the holder this run started (and only that one).
_RELEASE_LOCK = 'if [ "$(head -n 1 "$1" 2>/dev/null)" = "$2" ]; then kill "$(sed -n 2p "$1")" 2>/dev/null; fi; true'


@operation(is_idempotent=False, idempotent_notice="Takes the lock once per run and node.")
def node_locked():
    """
    Hold this node's lock for the rest of the run, so two runs never work on one node at once.

    The lock (``/run/lock/pyinfra-gpunode.lock``, ``flock``) is held by a process on the node
    until ``node_unlocked`` ends it or this run's connection closes (the run ends, fails or is
    killed). A second run waits up to 10 seconds, then fails the node naming the holder (run
    id, controlling machine, process, start time). Taken once per run and node however often
    the deploys call it; a dry run does not take it.

    **Example:**

    .. code:: python

        rollout.node_locked(name="node: locked for this run")
    """
    if not state.is_executing:
        host.noop("the node lock is taken when the run executes")
        return
    run = state._get_module()  # the State behind the context proxy
    locked = _LOCKED.setdefault(run, set())
    if host.name in locked:
        host.noop("this run holds the node lock")
        return
    if run not in _HOLDERS:
        _HOLDERS[run] = (
            f"pyinfra-gpunode run {uuid.uuid4().hex[:12]} from {socket.gethostname()} pid {os.getpid()} "
            f"since {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
        )
    yield StringCommand("sh", "-c", QuoteString(_TAKE_LOCK), "gpunode-lock", LOCK, QuoteString(_HOLDERS[run]))
    locked.add(host.name)


@operation(is_idempotent=False, idempotent_notice="Releases the lock this run holds, if any.")
def node_unlocked():
    """
    Release the node lock this run took with ``node_locked``, at the end of its work on the node.

    **Example:**

    .. code:: python

        rollout.node_unlocked(name="node: lock released")
    """
    run = state._get_module()  # the State behind the context proxy
    if not state.is_executing or host.name not in _LOCKED.get(run, set()):
        host.noop("this run holds no node lock")
        return
    yield StringCommand("sh", "-c", QuoteString(_RELEASE_LOCK), "gpunode-lock", LOCK, QuoteString(_HOLDERS[run]))
    _LOCKED[run].discard(host.name)


@operation(is_idempotent=False, idempotent_notice="Writes and restarts only on nodes whose config differs.")
def nvidia_runtime_rolled_out(order: list[str], nodes: dict[str, NodeSettings] | None = None):
    """
    Register the nvidia runtime and restart containerd node by node in ``order``: each node's
    files are written only when its turn comes, and the next node starts only after this one
    was verified. The first failure (a refused config, a unit that cannot be restarted, or a
    restart that does not verify and was rolled back) halts the rollout: later nodes are
    neither written nor restarted.

    + order: host names in rollout order (``pyinfra_gpunode.rollout.rollout_order``)
    + nodes: each node's own settings by host name: ``runtime`` (``containerd.nvidia_runtime``
      arguments), ``timeout`` (seconds its restart may take to bring the CRI plugin up) and
      ``restart`` (``rolling``, or ``none``: files only, no restart, outside the turns);
      a node not listed takes the defaults

    Add it with ``_serial=True`` for every host. The first host pyinfra runs it on conducts the
    whole rollout through nested operations (pyinfra takes serial hosts in random order), each
    node with its own settings; every host then reports its own node's outcome, so a failed
    node fails the run with its reason. At a node's turn its config tree is saved (a tar per
    turn under ``/var/lib/pyinfra-gpunode/backup``) right before its files are written, and a
    failed restart restores only that. A node whose containerd is not active is restarted and
    verified at its turn. Without ``-y`` the prepare pass prints each node's plan.

    **Example:**

    .. code:: python

        rollout.nvidia_runtime_rolled_out(
            name="containerd: nvidia runtime, one node at a time",
            order=["node1", "node2", "node3"],
            nodes={"node3": {"runtime": {"default_runtime": True}, "timeout": 60, "restart": "rolling"}},
            _serial=True,
        )
    """
    nodes = nodes or {}
    mine = node_settings(nodes, host.name)
    if not state.is_executing:
        yield from _plan(mine)
        return
    if mine["restart"] == "none":
        yield from _files_only(mine["runtime"])
        return
    run = state._get_module()  # type: ignore[attr-defined]  # the State behind the context proxy
    if run not in OUTCOMES:
        _conduct(run, order, nodes)
    outcome = OUTCOMES[run].get(host.name, "not in the rollout order")
    if outcome.startswith(("failed", "not in")):
        yield fail(f"containerd rollout {outcome}")
    else:
        host.noop(f"containerd rollout: {outcome}")


def _plan(settings: NodeSettings):
    found = containerd.registration(**settings["runtime"])
    rolling = settings["restart"] == "rolling"
    unit = unit_problem(found.service) if rolling and found.installed and not found.problem else None
    if found.problem or unit:
        logger.warning("%splan: %s", host.print_prefix, found.problem or unit)
    elif found.writes:
        then = "then restart containerd and verify" if rolling else "no restart (gpunode_containerd_restart: none)"
        logger.info("%splan: write %s, %s\n%s", host.print_prefix, ", ".join(found.writes), then, found.diff())
    elif rolling and found.restart_pending:
        reason = found.service["restart_reason"] if found.service else ""
        logger.info("%splan: restart containerd (%s) and verify", host.print_prefix, reason)
    else:
        host.noop("containerd runs the nvidia runtime config")
        return
    yield StringCommand("true")  # marks the change at prepare; at execute the rollout runs instead


def _files_only(runtime: dict[str, Any]):
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
    turns = [active[name] for name, mine in settings.items() if mine["restart"] == "rolling"]
    for name, mine in settings.items():
        if mine["restart"] != "rolling":
            outcomes[name] = "files only (gpunode_containerd_restart: none)"
    # Read every node in parallel first; only nodes with something to do take a (serial) turn.
    assert state.pool is not None
    checks = {node.name: state.pool.spawn(_check, state, node, settings[node.name]) for node in turns}
    halted_by = None
    for node in turns:
        found = checks[node.name].get()
        unit = unit_problem(found.service) if found.installed and not found.problem else None
        if halted_by:
            outcomes[node.name] = f"halted: not touched after the failure on {halted_by}"
        elif unit:
            outcomes[node.name] = f"failed: {unit}"
        elif not (found.problem or found.writes or found.restart_pending):
            outcomes[node.name] = "unchanged"
        else:
            outcomes[node.name] = _turn(state, node, settings[node.name], bool(found.writes))
        if not outcomes[node.name].startswith(("unchanged", "halted")):
            logger.info("%scontainerd rollout %s", node.print_prefix, outcomes[node.name])
        if outcomes[node.name].startswith("failed"):
            halted_by = halted_by or node.name
    logger.info("--> Summary (rollout order)\n%s", summary_table(_reports(state, order, outcomes)))


def _check(state: State, node: Host, settings: NodeSettings) -> containerd.Registration:
    """What the node's files and service need (reads only)."""
    with ctx_state.use(state), ctx_host.use(node):
        return containerd.registration(**settings["runtime"])


def _reports(state: State, order: list[str], outcomes: dict[str, str]) -> dict[str, NodeReport]:
    known = REPORTS.get(state, {})
    reports = {}
    for name in order:
        node = state.inventory.get_host(name)
        report = known.get(name, NodeReport())
        report.rollout = outcomes.get(name, "not reached (failed before the rollout)")
        metas = state.ops.get(node, {})
        report.changed = sorted({
            sorted(state.op_meta[op_hash].names)[0].rsplit(" | ", 1)[-1]
            for op_hash, data in metas.items()
            if data.operation_meta.is_complete() and data.operation_meta.did_change()
        })
        if report.rollout.startswith("halted"):
            report.pending.append("containerd config and restart: rollout halted")
        reports[name] = report
    return reports


def _turn(state: State, node: Host, settings: NodeSettings, writes: bool) -> str:
    """One node's turn: back up, write its files, restart and verify (what it wrote rolled back on failure)."""
    # The conducting host is inside this operation: its nested steps run as if it were not.
    saved = {name: getattr(node, name) for name in _OP_CONTEXT}
    node.in_op = False
    try:
        # pyinfra's context manager does not restore the host on an exception: catch inside it.
        with ctx_host.use(node):
            try:
                backup = _backup_path() if writes else None
                if backup:
                    containerd.config_backed_up(name="containerd: config backed up", path=backup)
                written = containerd.nvidia_runtime(name="containerd: nvidia runtime registered", **settings["runtime"])
                restarted = containerd.restarted_if_pending(
                    name="containerd: restarted and verified",
                    timeout=settings["timeout"],
                    backup=backup if written.did_change() else None,
                )
            except NestedOperationError as error:
                stderr = state.ops[node][error.args[0]].operation_meta.stderr.strip()
                return f"failed: {stderr.splitlines()[-1] if stderr else 'see the log above'}"
    finally:
        for name, value in saved.items():
            setattr(node, name, value)
    return "done" if written.did_change() or restarted.did_change() else "unchanged"


_OP_CONTEXT = ("in_op", "current_op_hash", "current_op_global_arguments", "current_op_deploy_data")
