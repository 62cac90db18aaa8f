"""Roll containerd's nvidia runtime config out one node at a time, in a fixed order, halting at a failure."""

from __future__ import annotations

import time
from collections.abc import Collection, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pyinfra import host, state
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.host import Host
from pyinfra.api.state import State

from pyinfra_gpunode.facts.identity import NodeIdentity
from pyinfra_gpunode.hook_process import turn_hook
from pyinfra_gpunode.hooks import hook_argv, shown_argv
from pyinfra_gpunode.log import logger, printable, shown
from pyinfra_gpunode.node_identity import Reported, hook_name, machine_of, reported, shared
from pyinfra_gpunode.operations import _lock, containerd, platform
from pyinfra_gpunode.operations._atomic import fail, write_file
from pyinfra_gpunode.operations._internals import (
    changed_operations,
    current_state,
    failed_operation,
    first_failure,
    on_host,
    operation_body,
    operation_result,
    outside_operation,
    spawn,
)
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.operations._shared import facts_unchanged, node_fact, read_afresh
from pyinfra_gpunode.rollout import (
    FILES_ONLY,
    NOT_IN_ORDER,
    TURN_MARKER,
    UNCHANGED,
    NodeReport,
    NodeSettings,
    Outcome,
    OutcomeKind,
    RolloutPolicy,
    TurnGroup,
    batch_size,
    eta_text,
    halt_lines,
    node_settings,
    plan_lines,
    progress_line,
    summary_table,
    timing_line,
    turn_changes,
    turn_groups,
    turn_mark_text,
    unit_problem,
)
from pyinfra_gpunode.settings import ROLLOUT_BATCH


@operation(is_idempotent=False, idempotent_notice="Takes the lock once per run and node.")
def node_locked() -> Generator[Any, Any, None]:
    """
    Hold this node's lock for the rest of the run's work on it, so two runs never work on one node at once.

    The lock (``/run/pyinfra-gpunode/node.lock``, ``flock``) is held by a process on the node
    until ``node_unlocked`` ends it (a rollout turn ends it with the turn's mark,
    ``turn_unmarked(release_lock=True)``) or this run's connection closes (the run ends, fails or is
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
    order: Sequence[str],
    nodes: dict[str, NodeSettings] | None = None,
    batch: int | str = ROLLOUT_BATCH,
    canary: int = 0,
    max_failed: int = 0,
) -> Generator[Any, Any, None]:
    """
    Take every disruptive change in turns, in ``order``: a node's turn runs the before-hook, its
    driver change (and reboot) with the GPU steps after it, writes its containerd files,
    restarts and verifies containerd, then runs the after-hook. First come the nodes an earlier
    run left mid-turn, each alone, then ``canary`` nodes each alone, then batches of ``batch``
    turns at the same time; a group starts only when every turn of the one before it ended.
    A failed turn (a hook that fails, a refused config, a unit that cannot be restarted, a driver
    that is not loaded after the reboot, or a restart that does not verify and was rolled back)
    counts against ``max_failed``: once more turns than that have failed, or any canary failed,
    no new turn starts; turns already running finish with their own verification and rollback.

    + order: host names in rollout order (``pyinfra_gpunode.rollout.rollout_order``)
    + nodes: each node's own settings by host name: ``runtime`` (``containerd.nvidia_runtime``
      arguments), ``timeout`` (seconds its restart may take to bring the CRI plugin up),
      ``restart`` (``rolling``, or ``none``: files only, no restart, outside the turns),
      ``before`` and ``after`` (argv run on the controller around the turn, ``{node}`` and
      ``{hostname}`` filled in; ``[]``: none), ``hook_timeout`` (seconds per hook), ``node_name``
      (the node's Kubernetes name for its hooks; None: the one it reports), ``driver``
      (the driver changes planned for the turn, as ``driver.driver_changes`` lists them) and
      ``steps`` (a callable adding the driver and GPU operations, called at the turn); a node
      not listed takes the defaults
    + batch: turns at the same time after the canary: a whole number, or a percentage of the
      nodes in the run (``"10%"``, rounded down, at least 1); nodes out of service before the
      rollout (unreachable, or down and refused) count against it
    + canary: how many nodes, first in rollout order, take their turn alone before any batch
    + max_failed: how many failed turns the rollout goes on past

    Add it with ``_serial=True`` for every host. The first host pyinfra runs it on conducts the
    whole rollout through nested operations (pyinfra takes serial hosts in random order), each
    node with its own settings; every host then reports its own node's outcome, so a failed
    node fails the run with its reason. A node with nothing disruptive to do takes no turn and
    runs no hook. The hooks run on the controller without a shell, with the controller's
    environment plus ``GPUNODE_HOOK``, ``GPUNODE_NODE``, ``GPUNODE_HOSTNAME``,
    ``GPUNODE_CHANGES`` (the turn's planned changes, one a line), ``GPUNODE_DRIVER_CHANGE``,
    ``GPUNODE_TURN`` (``k/n``) and ``GPUNODE_BATCH`` (``canary 1/1``, ``batch 2/5``, ...);
    the hooks of a batch run at the same time, their output prefixed with their node. At its end a
    node's lock this run still holds is released (a turn releases it with the turn's mark; a failed
    node keeps it until it expires), so ``node_unlocked`` need not follow.
    A failed before-hook leaves its node untouched; a turn that failed runs no after-hook (the
    node stays as the before-hook left it, e.g. cordoned). A turn marks its node
    (``/var/lib/pyinfra-gpunode/turn.json``) until its after-hook ended: a later run takes a
    marked node's turn first, hooks included, restarting and verifying containerd (rolled back
    to the backup the cut-off turn took, if it took one). At a node's turn its config tree is
    saved (a tar per turn under ``/var/lib/pyinfra-gpunode/backup``) right before its files
    are written, and a failed restart restores only that. A node whose containerd is not
    active is restarted and verified at its turn. Without ``-y`` the prepare pass prints each
    node's plan, hooks included, and the rollout's groups in order; hooks never run then.

    **Example:**

    .. code:: python

        rollout.nvidia_runtime_rolled_out(
            name="containerd: nvidia runtime, in turns",
            order=["node1", "node2", "node3", "node4"],
            nodes={"node3": {"runtime": {"default_runtime": True}, "timeout": 60, "restart": "rolling",
                             "before": ["kubectl", "drain", "{hostname}", "--ignore-daemonsets"]}},
            canary=1,
            batch=2,
            max_failed=0,
            _serial=True,
        )
    """
    nodes = nodes or {}
    policy = RolloutPolicy(tuple(order), batch, canary, max_failed)
    batch_size(batch, len(order))  # refuses a bad value before anything runs
    mine = node_settings(nodes, host.name)
    if not state.is_executing:
        yield from _plan(mine)
        return
    if not _takes_turns(mine):
        yield from _files_only(mine["runtime"])
        yield from _lock.release()
        return
    run = current_state()
    outcomes = run_state(run).outcomes
    if outcomes is None:
        outcomes = _conduct(run, policy, nodes)
    outcome = outcomes.get(host.name, NOT_IN_ORDER)
    if outcome.kind in (OutcomeKind.FAILED, OutcomeKind.NOT_IN_ORDER):
        yield fail(f"containerd rollout {outcome}")
        return
    host.noop(f"containerd rollout: {outcome}")
    yield from _lock.release()  # where a step before the rollout took it and no turn released it


def _takes_turns(settings: NodeSettings) -> bool:
    """Whether the node's disruptive steps wait for its turn: a containerd restart (``rolling``) or a
    driver change (whatever ``gpunode_containerd_restart`` says)."""
    return settings["restart"] == "rolling" or bool(settings["driver"])


def _plan(settings: NodeSettings) -> Generator[Any, Any, None]:
    found = containerd.registration(**settings["runtime"])
    run_state(current_state()).planned[host.name] = (found, settings)
    rolling = settings["restart"] == "rolling"
    unit = _unit_problem(found, settings) or _cri_refusal(found, settings)
    if _k0s(found) and found.writes and not rolling:  # containerd.nvidia_runtime fails such a node
        unit = (
            f"k0s restarts its containerd when {', '.join(found.writes)} is written, so it is not written "
            "with gpunode_containerd_restart: none (use rolling: written in the node's turn)"
        )
    elif _platform_turn(found) and not rolling and found.platform:
        unit = (
            f"{', '.join(found.writes)} takes effect only when {found.platform['unit']} restarts, so it is not "
            "written with gpunode_containerd_restart: none (use rolling: written in the node's turn, with the restart)"
        )
    changes = turn_changes(settings["driver"], found.writes, found.restart_reason if rolling else None)
    changes += _resumed_changes(found) if _takes_turns(settings) else []
    named, refused = _hook_hostname(host, settings) if _takes_turns(settings) else ("", None)
    if _takes_turns(settings):  # as the rollout's start records it: every node with hooks, a turn or not
        _identified(current_state(), host, named)
    hostname, refused = (named, refused) if changes else ("", None)
    if found.mode_line and not found.problem:  # NRI mode: the plan names it
        logger.info("%splan: %s", host.print_prefix, found.mode_line)
    if found.problem or unit or refused:
        logger.warning("%splan: %s", host.print_prefix, found.problem or unit or refused)
    elif not changes and not found.writes:
        if found.note:  # k3s or RKE2 adding nvidia themselves: the plan says so
            logger.info("%splan: %s", host.print_prefix, found.note)
        what = "NRI mode config" if found.mode_line else "nvidia runtime config"
        host.noop(found.note or f"containerd runs the {what}; nothing disruptive to do")
        return
    else:
        hooks = _plan_hooks(settings, hostname) if _takes_turns(settings) and changes else []
        for line in hooks[:1] + settings["driver"] + _resumed_changes(found):
            logger.info("%splan: %s", host.print_prefix, line)
        if found.writes and found.note and _platform_turn(found):  # the platform's containerd restarts with it
            logger.info("%splan: %s\n%s", host.print_prefix, found.note, found.diff())
        elif found.writes:
            then = "then restart containerd and verify" if rolling else "no restart (gpunode_containerd_restart: none)"
            logger.info("%splan: write %s, %s\n%s", host.print_prefix, ", ".join(found.writes), then, found.diff())
        elif rolling and found.restart_pending and found.platform:
            logger.info("%splan: %s; restart it and verify", host.print_prefix, found.restart_reason)
        elif rolling and found.restart_pending:
            logger.info("%splan: restart containerd (%s) and verify", host.print_prefix, found.restart_reason)
        for line in hooks[1:]:
            logger.info("%splan: %s", host.print_prefix, line)
    yield StringCommand("true")  # marks the change at prepare; at execute the rollout runs instead


def _k0s(found: containerd.Registration) -> bool:
    """Whether the node is a k0s node, where writing the drop-in restarts containerd (k0s does)."""
    return bool(found.platform and found.platform["name"] == "k0s")


def _platform_turn(found: containerd.Registration) -> bool:
    """Whether one step writes the platform's drop-in and restarts and verifies its containerd
    (``platform.runtime_dropin_applied``): on every k0s node, and on a k3s or RKE2 node with a drop-in to
    write."""
    return _k0s(found) or bool(found.platform and found.writes)


def _resumed_changes(found: containerd.Registration) -> list[str]:
    """The line a node an earlier run left mid-turn adds to its turn's changes (``[]`` for others)."""
    if found.turn_mark is None:
        return []
    lines = [f"resume the turn an earlier run began at {found.turn_mark.started}: restart containerd and verify"]
    if found.turn_mark_problem:
        logger.warning("%s%s", host.print_prefix, found.turn_mark_problem)
    return lines


def planned_rollout(run: State, policy: RolloutPolicy) -> None:
    """Print the rollout's groups in order, from the dry-run plans of the nodes that take turns; nothing
    where no plan was made (with ``-y`` the rollout prints its groups when it starts)."""
    planned = run_state(run).planned
    judged = {name: planned[name] for name in policy.order if name in planned and _takes_turns(planned[name][1])}
    if judged:
        logger.info("--> Rollout plan\n%s", "\n".join(_layout(run, policy, judged).lines))


def _plan_hooks(settings: NodeSettings, hostname: str) -> list[str]:
    """The turn's before- and after-hook as the plan lists them (never run in a dry run)."""
    lines = []
    for which in ("before", "after"):
        argv = hook_argv(settings[which], host.name, hostname)
        lines.append(f"{which}-hook on the controller: {shown_argv(argv)}" if argv else f"{which}-hook: none")
    return lines


def _hook_hostname(node: Host, settings: NodeSettings) -> tuple[str, str | None]:
    """The node's Kubernetes name for its hooks (``{hostname}`` and ``GPUNODE_HOSTNAME``, which every hook
    gets), read where the node has a hook: ``gpunode_node_name`` where the node answers to it, else the name
    the node reports (``node_identity.node_name``); and why no hook may run against it, or ``None``. A
    reported name that is no node name refuses the node only where a hook names ``{hostname}`` (it would
    reach the controller's commands); ``GPUNODE_HOSTNAME`` is left empty then. A ``gpunode_node_name`` the
    node does not answer to always refuses it."""
    hooks = (*settings["before"], *settings["after"])
    if not hooks:
        return "", None
    return hook_name(node.name, settings["node_name"], hooks, _identity())


def _identity() -> Reported:
    """What the current node says it is (from its snapshot where that is current)."""
    return node_fact(NodeIdentity) or reported("")  # None where the read failed: pyinfra fails the node


def _identified(run: State, node: Host, name: str) -> None:
    """Record the node's hook name (``""``: none) and machine id for the rollout's check that no two nodes
    share either (``_shared_identities``)."""
    run_state(run).identities[node.name] = (name, machine_of(_identity()))


def _shared_identities(run: State, names: Collection[str]) -> dict[str, str]:
    """Why each of ``names`` that shares its hook name or its machine with another node of the run takes
    no turn: drained in another's turn, or two turns at once on one machine."""
    known = {name: run_state(run).identities[name] for name in names if name in run_state(run).identities}
    by_machine = shared({name: machine for name, (_, machine) in known.items()}, "machine (machine id, boot id)")
    by_name = shared({name: node for name, (node, _) in known.items()}, "Kubernetes node name")
    return {name: by_machine.get(name) or by_name[name] for name in {*by_machine, *by_name}}


def _files_only(runtime: dict[str, Any]) -> Generator[Any, Any, None]:
    """A ``restart: none`` node: its files (after a backup), no restart, no turn."""
    if containerd.registration(**runtime).writes:
        yield from operation_body(containerd.config_backed_up)(path=_backup_path())
    yield from operation_body(containerd.nvidia_runtime)(**runtime)


def _backup_path() -> str:
    return f"{containerd.BACKUP_DIR}/containerd-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}.tar"


def _conduct(state: State, policy: RolloutPolicy, nodes: Mapping[str, NodeSettings]) -> dict[str, Outcome]:
    """Conduct the whole rollout; every node's outcome (the run's ``outcomes`` from the start: the other
    hosts of the serial operation report theirs from it)."""
    began = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    run_state(state).outcomes = outcomes
    active = {node.name: node for node in state.inventory.get_active_hosts()}
    settings = {name: node_settings(nodes, name) for name in policy.order if name in active}
    for name, mine in settings.items():
        if not _takes_turns(mine):
            outcomes[name] = FILES_ONLY
    # Read every node in parallel first; only nodes with something to do take a turn.
    checks = {
        name: spawn(state, _check, state, active[name], mine) for name, mine in settings.items() if _takes_turns(mine)
    }
    layout = _layout(state, policy, {name: (check.get(), settings[name]) for name, check in checks.items()})
    logger.info("--> Rollout plan\n%s", "\n".join(layout.lines))
    for name in layout.unchanged:
        outcomes[name] = UNCHANGED
        note = layout.judged[name][0].note
        if note:  # k3s or RKE2 adding nvidia themselves
            logger.info("%s%s", active[name].print_prefix, note)
    clock = _Clock(layout.groups)
    failed: list[str] = []
    halted = ""
    for group in layout.groups:
        if halted:
            outcomes.update({name: Outcome.halted(halted) for name in group.nodes})
            continue
        started = time.monotonic()
        turns = {name: spawn(state, _timed_turn, state, active[name], layout, group, clock) for name in group.nodes}
        outcomes.update({name: turn.get() for name, turn in turns.items()})
        clock.group_seconds.append(time.monotonic() - started)
        failed += [name for name in group.nodes if outcomes[name].kind is OutcomeKind.FAILED]
        halted = _halt_reason(group, failed, policy.max_failed)
    if failed or halted:
        untouched = [name for name in policy.order if name in outcomes and outcomes[name].kind is OutcomeKind.HALTED]
        for line in halt_lines(failed, untouched):
            logger.warning("--> %s", line)
    logger.info(
        "--> Summary (rollout order)\n%s\n%s",
        summary_table(_reports(state, list(policy.order), outcomes)),
        timing_line(clock.turn_seconds, len(layout.groups), time.monotonic() - began),
    )
    return outcomes


def _halt_reason(group: TurnGroup, failed: list[str], max_failed: int) -> str:
    """Why no new turn starts after ``group`` ended (``""``: the rollout goes on)."""
    if group.kind == "canary" and group.nodes[0] in failed:
        return f"not touched after the failure on the canary {group.nodes[0]}"
    if len(failed) <= max_failed:
        return ""
    if max_failed == 0:
        return f"not touched after the failure on {failed[0]}"
    names = ", ".join(failed)
    return f"not touched after {len(failed)} failed turns ({names}; gpunode_rollout_max_failed is {max_failed})"


@dataclass
class _Layout:
    """The rollout's groups from every node's read: who takes a turn when, who fails in its slot
    without being touched (``refused``), who has nothing to do, who is out of service."""

    judged: dict[str, tuple[containerd.Registration, NodeSettings]]
    groups: list[TurnGroup] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _layout(
    run: State, policy: RolloutPolicy, judged: dict[str, tuple[containerd.Registration, NodeSettings]]
) -> _Layout:
    layout = _Layout(judged)
    gone = {
        name: "failed or unreachable before the rollout"
        for name in policy.order
        if name not in judged and run.inventory.get_host(name) in run.failed_hosts
    }
    down: dict[str, str] = {}
    turns = []
    same = _shared_identities(run, judged)
    for name, (found, mine) in judged.items():
        refusal = _unit_problem(found, mine) or _cri_refusal(found, mine) or same.get(name)
        why = _out_of_service(found)
        if refusal:
            layout.refused[name] = refusal
        if why and refusal:
            gone[name] = f"{why}, refused"  # stays down: no turn of its own mends it
        elif why:
            down[name] = f"{why} until its turn"
        if refusal or _turn_needed(found, mine):
            turns.append(name)
        else:
            layout.unchanged.append(name)
    size = batch_size(policy.batch, len(judged) + sum(1 for name in gone if name not in judged))
    resumed = [name for name in turns if judged[name][0].turn_mark is not None and name not in layout.refused]
    layout.groups = turn_groups(turns, policy.canary, size, resumed, set(down), len(gone))
    layout.lines = plan_lines(layout.groups, {**gone, **down}, size)
    layout.lines += [f"refused, fails in its slot untouched: {name}: {why}" for name, why in same.items()]
    return layout


def _out_of_service(found: containerd.Registration) -> str | None:
    """Why the node serves no pods now (containerd not active, its CRI plugin failed), or ``None``."""
    if found.service and found.service.get("load_state") == "loaded" and found.service.get("active_state") != "active":
        return f"containerd {found.service.get('active_state') or 'not active'}"
    if found.restart_reason and found.restart_reason.startswith("its CRI plugin failed"):
        return "its CRI plugin failed"
    return None


@dataclass
class _Clock:
    """The rollout's turns as they end: numbering, progress lines, timings."""

    groups: list[TurnGroup]
    group_seconds: list[float] = field(default_factory=list)
    turn_seconds: dict[str, float] = field(default_factory=dict)

    def number(self, name: str) -> str:
        names = [node for group in self.groups for node in group.nodes]
        return f"{names.index(name) + 1}/{len(names)}"

    def ended(self, node: Host, group: TurnGroup, outcome: Outcome, seconds: float) -> None:
        if outcome.kind is OutcomeKind.UNCHANGED:
            return
        self.turn_seconds[node.name] = seconds
        left = len(self.groups) - len(self.group_seconds) - 1  # the groups after this turn's
        eta = eta_text(self.group_seconds or [seconds], left)
        word = outcome.kind.value
        turn, turns = self.number(node.name).split("/")
        logger.info("--> %s", progress_line(int(turn), int(turns), group, node.name, word, seconds, eta))


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
    write, a restart due (``rolling`` only), a driver change, or a turn an earlier run left unfinished."""
    restart = found.restart_pending and settings["restart"] == "rolling"
    return bool(found.problem or found.writes or restart or settings["driver"] or found.turn_mark)


def _check(state: State, node: Host, settings: NodeSettings) -> containerd.Registration:
    """What the node's files and service need, and who the node is (reads only)."""
    with on_host(state, node):
        found = containerd.registration(**settings["runtime"])
        hostname, _ = _hook_hostname(node, settings)
        _identified(state, node, hostname)
        return found


def _reports(state: State, order: list[str], outcomes: dict[str, Outcome]) -> dict[str, NodeReport]:
    known = run_state(state).reports
    reports = {}
    for name in order:
        node = state.inventory.get_host(name)
        report = known.get(name, NodeReport())
        outcome = outcomes.get(name)
        report.rollout = str(outcome) if outcome is not None else _not_reached(state, node)
        report.changed = sorted({name.rsplit(" | ", 1)[-1] for name in changed_operations(state, node)})
        if outcome is not None and outcome.kind is OutcomeKind.HALTED:
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


def _timed_turn(state: State, node: Host, layout: _Layout, group: TurnGroup, clock: _Clock) -> Outcome:
    """``node``'s turn in ``group`` (or its failure in its slot, untouched, where it was refused), timed
    and reported as it ends. An unforeseen error ends this turn only, not the others of its batch."""
    began = time.monotonic()
    found, settings = layout.judged[node.name]
    refused = layout.refused.get(node.name)
    if refused:
        outcome = Outcome.failed(refused)
    else:
        try:
            outcome = _turn(state, node, settings, found, _Position(clock.number(node.name), group.label))
        except Exception as error:  # reported as this node's failure
            outcome = Outcome.failed(f"{type(error).__name__}: {printable(str(error))[:500]}")
    if outcome.kind not in (OutcomeKind.UNCHANGED, OutcomeKind.HALTED):
        logger.info("%scontainerd rollout %s", node.print_prefix, outcome)
    clock.ended(node, group, outcome, time.monotonic() - began)
    return outcome


@dataclass(frozen=True)
class _Position:
    """Where a turn stands in the rollout, for its hooks: ``GPUNODE_TURN`` and ``GPUNODE_BATCH``."""

    turn: str = "1/1"
    batch: str = "batch 1/1"


def _turn(
    state: State, node: Host, settings: NodeSettings, found: containerd.Registration, position: _Position
) -> Outcome:
    """One node's turn: the node lock, and the node read again under it; the turn's mark; before-hook;
    driver and GPU steps; back up, write its files, restart and verify (what it wrote rolled back on
    failure); after-hook; the mark removed and the node lock released, in one command. ``found`` is the
    run's earlier read: the turn decides from its own. Returns the outcome."""
    rolling = settings["restart"] == "rolling"
    did: list[str] = []
    # The conducting host is inside this operation: its nested steps run as if it were not.
    # pyinfra's context manager does not restore the host on an exception: catch inside it.
    with outside_operation(node), on_host(state, node):
        try:
            node_locked(name="node: locked for its turn")  # before the before-hook drains it
        except NestedOperationError as error:
            return Outcome.failed(f"{_cause(state, node, error)}; the node was not touched")
        read_afresh(state, node.name)  # the node may have changed since the run's read
        found = containerd.registration(**settings["runtime"])
        hooked = not found.problem  # a refused config fails the node at once: no hook, no driver change
        hostname, refused = _hook_hostname(node, settings) if hooked else ("", None)
    recorded = run_state(state).identities.get(node.name)
    if hooked and not refused and recorded and hostname != recorded[0]:
        refused = f"the node's name changed since the run read it ({shown(recorded[0])}, now {shown(hostname)})"
    unit = _unit_problem(found, settings) or _cri_refusal(found, settings)
    if refused or unit:
        return Outcome.failed(f"{refused or unit}; the node was not touched")
    if not _turn_needed(found, settings):
        return UNCHANGED
    mark = found.turn_mark
    changes = turn_changes(settings["driver"], found.writes, found.restart_reason if rolling else None)
    changes += _resumed_changes(found)
    if hooked and mark is None:
        with outside_operation(node), on_host(state, node):
            try:
                turn_marked(name="rollout: turn marked on the node", started=datetime.now(UTC).isoformat())
            except NestedOperationError as error:
                return Outcome.failed(f"{_cause(state, node, error)}; the node was not touched")
    if hooked and settings["before"]:
        failure = _turn_hook(node, "before", settings, hostname, changes, position)
        if failure:
            return Outcome.failed(f"before-hook {failure}; the node was not touched")
        did.append("before-hook")
    with outside_operation(node), on_host(state, node):
        try:
            if hooked and settings["steps"]:
                settings["steps"]()
                did.extend(settings["driver"])  # a reboot among them takes the lock again itself
                found = containerd.registration(**settings["runtime"])  # the steps changed the node
            # The write restarts the platform's containerd: one step writes, restarts and verifies.
            platform_turn = _platform_turn(found) and not found.problem
            if platform_turn:
                written = platform.runtime_dropin_applied(
                    name="containerd: k0s drop-in written, k0s' containerd verified"
                    if _k0s(found)
                    else "containerd: agent drop-in written, unit restarted, containerd verified",
                    timeout=settings["timeout"],
                    runtime=settings["runtime"],
                )
            # A refused config: no backup; a platform's drop-in: its own, taken by its step.
            backup = _backup_path() if found.writes and not found.problem and not platform_turn else None
            backup_cri_problem = found.current_cri_problem
            if backup:
                containerd.config_backed_up(name="containerd: config backed up", path=backup)
            if backup and hooked:  # the mark names this run's backup: the node as it is now, before this write
                turn_marked(
                    name="rollout: turn's backup marked on the node",
                    started=mark.started if mark else datetime.now(UTC).isoformat(),
                    backup=backup,
                    backup_cri_problem=backup_cri_problem,
                )
            if not platform_turn:
                written = containerd.nvidia_runtime(name="containerd: nvidia runtime registered", **settings["runtime"])
            if not backup and mark and mark.backup:
                # Nothing to write: the files are as the cut-off turn wrote them, and what it saved before it wrote
                # is what a failure restores. Where this run writes, the node changed since (a rollback, an edit):
                # only this run's backup holds it as it is.
                backup, backup_cri_problem = mark.backup, mark.backup_cri_problem
            elif not written.did_change():
                backup = None
            restarted = (
                platform.unit_restarted(
                    name="containerd: platform unit restarted and verified", timeout=settings["timeout"]
                )
                if rolling and found.platform
                else containerd.restarted_if_pending(
                    name="containerd: restarted and verified",
                    timeout=settings["timeout"],
                    backup=backup,
                    dropped_runtimes=found.dropped_runtimes,
                    backup_cri_problem=backup_cri_problem,
                    resumed=mark is not None,
                    mode=settings["runtime"].get("mode", "runtime"),
                )
                if rolling
                else None
            )
        except NestedOperationError as error:
            unrun = "; after-hook not run" if hooked and settings["after"] else ""
            return Outcome.failed(f"{_cause(state, node, error)}{unrun}")
    if written.did_change():
        did.append("containerd written")
    if restarted and restarted.did_change():
        did.append("containerd restarted and verified")
    if hooked and settings["after"]:
        failure = _turn_hook(node, "after", settings, hostname, changes, position)
        if failure:
            return Outcome.failed(f"after-hook {failure}; the node was changed: {', '.join(did)}")
        did.append("after-hook")
    if hooked:
        with outside_operation(node), on_host(state, node):
            try:
                turn_unmarked(name="rollout: turn's mark removed, node lock released", release_lock=True)
            except NestedOperationError as error:
                return Outcome.failed(
                    f"{_cause(state, node, error)}; the node was changed: {', '.join(did) or 'nothing'}"
                )
    return Outcome.done(did)


@operation(is_idempotent=False, idempotent_notice="Marks the turn each time it is called.")
def turn_marked(
    started: str, backup: str | None = None, backup_cri_problem: str | None = None
) -> Generator[Any, Any, None]:
    """
    Mark a rollout turn as under way on this node (``/var/lib/pyinfra-gpunode/turn.json``, root,
    mode 0600), so that a later run finds a turn this one did not end and takes it first.

    + started: when the turn began (ISO 8601)
    + backup: the config backup the turn took before writing, which a resumed turn restores on failure
    + backup_cri_problem: why that backup's config would not start the CRI plugin (then it is never restored)

    **Example:**

    .. code:: python

        rollout.turn_marked(name="rollout: turn marked", started="2026-12-01T20:00:00+00:00")
    """
    # The mark is the turn's own note under /var/lib: the containerd state the turn read stays current (it is
    # not read again for the mark alone; the turn keeps the mark it found before writing its own).
    facts_unchanged()
    yield from write_file(TURN_MARKER, turn_mark_text(started, backup, backup_cri_problem), mode="600")


@operation(is_idempotent=False, idempotent_notice="Removes the mark whether or not it is there.")
def turn_unmarked(release_lock: bool = False) -> Generator[Any, Any, None]:
    """
    Remove this node's turn mark once its turn ended (after its after-hook).

    + release_lock: also release the node lock this run holds (``node_unlocked``), in the same command: the
      turn was this run's last change to the node, and the lock is not held through the other nodes' turns

    **Example:**

    .. code:: python

        rollout.turn_unmarked(name="rollout: turn's mark removed")
    """
    unmark = StringCommand("rm", "-f", TURN_MARKER)
    release = list(_lock.release()) if release_lock else []  # nothing where this run holds no lock
    yield StringCommand(unmark, "&&", release[0]) if release else unmark


def _cause(state: State, node: Host, error: NestedOperationError) -> str:
    """The last line the failed nested operation printed on stderr."""
    stderr = operation_result(state, node, failed_operation(error)).stderr.strip()
    return stderr.splitlines()[-1] if stderr else "see the log above"


def _turn_hook(
    node: Host,
    which: Literal["before", "after"],
    settings: NodeSettings,
    hostname: str,
    changes: list[str],
    position: _Position,
) -> str | None:
    """The node's ``which`` hook run for its turn (``hook_process.turn_hook``): ``None``, or why it failed."""
    return turn_hook(
        which,
        settings[which],
        settings["hook_timeout"],
        node.name,
        hostname,
        changes,
        prefix=node.print_prefix,
        turn=position.turn,
        batch=position.batch,
        driver=settings["driver_versions"],
    )
