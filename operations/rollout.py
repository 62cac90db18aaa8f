"""Roll containerd's nvidia runtime config out one node at a time, in a fixed order, halting at a failure."""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host, state
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import containerd
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.rollout import NodeReport, summary_table

# Per run (State): node name -> "done", "unchanged", "failed: <reason>" or "halted: <reason>".
OUTCOMES: weakref.WeakKeyDictionary[State, dict[str, str]] = weakref.WeakKeyDictionary()
# Per run (State): node name -> what the earlier steps skipped or left pending, for the summary.
REPORTS: weakref.WeakKeyDictionary[State, dict[str, NodeReport]] = weakref.WeakKeyDictionary()


@operation(is_idempotent=False, idempotent_notice="Writes and restarts only on nodes whose config differs.")
def nvidia_runtime_rolled_out(order: list[str], runtime: dict[str, Any] | None = None, timeout: int = 60):
    """
    Register the nvidia runtime and restart containerd node by node in ``order``: each node's
    files are written only when its turn comes, and the next node starts only after this one
    was verified. The first failure (a refused config, or a restart that does not verify and
    was rolled back) halts the rollout: later nodes are neither written nor restarted.

    + order: host names in rollout order (``pyinfra_gpunode.rollout.rollout_order``)
    + runtime: ``containerd.nvidia_runtime`` arguments
    + timeout: seconds each restart may take to bring the CRI plugin up

    Add it with ``_serial=True`` for every host. The first host pyinfra runs it on conducts the
    whole rollout through nested operations (pyinfra takes serial hosts in random order); every
    host then reports its own node's outcome, so a failed node fails the run with its reason.
    Without ``-y`` the prepare pass prints each node's plan: the files it would write (as a
    diff), the gate that refuses them, or a pending restart.

    **Example:**

    .. code:: python

        rollout.nvidia_runtime_rolled_out(
            name="containerd: nvidia runtime, one node at a time",
            order=["node1", "node2", "node3"],
            _serial=True,
        )
    """
    runtime = runtime or {}
    if not state.is_executing:
        yield from _plan(runtime)
        return
    run = state._get_module()  # type: ignore[attr-defined]  # the State behind the context proxy
    if run not in OUTCOMES:
        _conduct(run, order, runtime, timeout)
    outcome = OUTCOMES[run].get(host.name, "not in the rollout order")
    if outcome.startswith(("failed", "not in")):
        yield fail(f"containerd rollout {outcome}")
    else:
        host.noop(f"containerd rollout: {outcome}")


def _plan(runtime: dict[str, Any]):
    found = containerd.registration(**runtime)
    if found.problem:
        logger.warning("%splan: %s", host.print_prefix, found.problem)
    elif found.writes:
        logger.info("%splan: write %s, then restart containerd and verify\n%s",
                    host.print_prefix, ", ".join(found.writes), found.diff())
    elif found.restart_pending:
        logger.info("%splan: restart containerd (its config is newer than the daemon) and verify", host.print_prefix)
    else:
        host.noop("containerd runs the nvidia runtime config")
        return
    yield StringCommand("true")  # marks the change at prepare; at execute the rollout runs instead


def _conduct(state: State, order: list[str], runtime: dict[str, Any], timeout: int) -> None:
    outcomes: dict[str, str] = {}
    OUTCOMES[state] = outcomes
    active = {node.name: node for node in state.inventory.get_active_hosts()}
    nodes = [active[name] for name in order if name in active]
    # Read every node in parallel first; only nodes with something to do take a (serial) turn.
    assert state.pool is not None
    checks = {node.name: state.pool.spawn(_has_work, state, node, runtime) for node in nodes}
    halted_by = None
    for node in nodes:
        if halted_by:
            outcomes[node.name] = f"halted: not touched after the failure on {halted_by}"
        elif not checks[node.name].get():
            outcomes[node.name] = "unchanged"
        else:
            outcomes[node.name] = _turn(state, node, runtime, timeout)
            logger.info("%scontainerd rollout %s", node.print_prefix, outcomes[node.name])
            if outcomes[node.name].startswith("failed"):
                halted_by = node.name
    logger.info("--> Summary (rollout order)\n%s", summary_table(_reports(state, order, outcomes)))


def _has_work(state: State, node: Host, runtime: dict[str, Any]) -> bool:
    """Whether the node's files would change, are refused, or wait for a restart (reads only)."""
    with ctx_state.use(state), ctx_host.use(node):
        found = containerd.registration(**runtime)
    return bool(found.problem or found.writes or found.restart_pending)


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


def _turn(state: State, node: Host, runtime: dict[str, Any], timeout: int) -> str:
    """One node's turn: write its files, restart and verify (rolled back on failure)."""
    # The conducting host is inside this operation: its nested steps run as if it were not.
    saved = {name: getattr(node, name) for name in _OP_CONTEXT}
    node.in_op = False
    try:
        # pyinfra's context manager does not restore the host on an exception: catch inside it.
        with ctx_host.use(node):
            try:
                written = containerd.nvidia_runtime(name="containerd: nvidia runtime registered", **runtime)
                restarted = containerd.restarted_if_pending(
                    name="containerd: restarted and verified", timeout=timeout
                )
            except NestedOperationError as error:
                stderr = state.ops[node][error.args[0]].operation_meta.stderr.strip()
                return f"failed: {stderr.splitlines()[-1] if stderr else 'see the log above'}"
    finally:
        for name, value in saved.items():
            setattr(node, name, value)
    return "done" if written.did_change() or restarted.did_change() else "unchanged"


_OP_CONTEXT = ("in_op", "current_op_hash", "current_op_global_arguments", "current_op_deploy_data")
