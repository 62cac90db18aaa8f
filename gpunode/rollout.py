"""Rollout order and the per-node report of a run (no I/O)."""

from __future__ import annotations

import json
import re
import statistics
import textwrap
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypedDict

from pyinfra_gpunode.hostdata import HostDataError, batch_value_problem
from pyinfra_gpunode.log import shown
from pyinfra_gpunode.settings import CONTAINERD_RESTART, HOOK_TIMEOUT, RESTART_TIMEOUT, ROLLOUT_BATCH


def rollout_order(inventory: Sequence[str], first: Sequence[str]) -> list[str]:
    """
    The order nodes take their turn in: ``first`` (``gpunode_rollout_order``, e.g. a canary),
    then every other node in inventory order. Unknown or repeated names are refused.
    """
    unknown = [name for name in first if name not in inventory]
    if unknown:
        raise HostDataError(
            f"host-data key 'gpunode_rollout_order' names hosts not in the inventory: {', '.join(unknown)}"
        )
    repeated = sorted({name for name in first if list(first).count(name) > 1})
    if repeated:
        raise HostDataError(f"host-data key 'gpunode_rollout_order' names hosts twice: {', '.join(repeated)}")
    return [*first, *(name for name in inventory if name not in first)]


@dataclass(frozen=True)
class RolloutPolicy:
    """How the whole run takes its turns (the same on every host): ``order`` (``rollout_order``),
    ``batch`` (``gpunode_rollout_batch``: a number or ``"N%"``), ``canary`` and ``max_failed``."""

    order: tuple[str, ...] = ()
    batch: int | str = ROLLOUT_BATCH
    canary: int = 0
    max_failed: int = 0


def batch_size(batch: int | str, nodes_in_run: int) -> int:
    """Turns per batch: ``batch`` itself, or its percentage of ``nodes_in_run`` rounded down, at least 1."""
    problem = batch_value_problem(batch)
    if problem:
        raise HostDataError(f"host-data key 'gpunode_rollout_batch': {problem}, got {batch!r}")
    if isinstance(batch, int):
        return batch
    return max(1, nodes_in_run * int(batch[:-1]) // 100)


@dataclass(frozen=True)
class TurnGroup:
    """Nodes whose turns run at the same time: a ``resumed`` node or a ``canary`` (alone), or a ``batch``."""

    kind: str  # "resumed", "canary" or "batch"
    index: int  # 1-based, within its kind
    count: int  # groups of its kind
    nodes: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.index}/{self.count}"


def turn_groups(
    turns: Sequence[str],
    canary: int,
    size: int,
    resumed: Collection[str] = (),
    down: Collection[str] = (),
    already_down: int = 0,
) -> list[TurnGroup]:
    """
    The turns in the order they run: each node caught mid-turn by an earlier run alone and first,
    then the first ``canary`` other nodes each alone, then batches of up to ``size`` in ``turns``
    order. Nodes out of service count against each batch they are not in: ``already_down`` nodes
    without a turn of their own, and the nodes of ``down`` (containerd not active, CRI failed) whose
    turn comes after it; a batch always holds at least one turn.
    """
    again = [name for name in turns if name in resumed]
    rest = [name for name in turns if name not in resumed]
    canaries, others = rest[:canary], rest[canary:]
    batches: list[tuple[str, ...]] = []
    start = 0
    while start < len(others):
        capacity = batch_capacity(size, already_down)
        while True:  # shrinks until the nodes down after this batch are counted: at most len(others) rounds
            later = sum(1 for name in others[start + capacity :] if name in down)
            fitting = batch_capacity(size, already_down + later)
            if fitting >= capacity:
                break
            capacity = fitting
        batches.append(tuple(others[start : start + capacity]))
        start += capacity
    return [
        *(TurnGroup("resumed", k, len(again), (name,)) for k, name in enumerate(again, 1)),
        *(TurnGroup("canary", k, len(canaries), (name,)) for k, name in enumerate(canaries, 1)),
        *(TurnGroup("batch", k, len(batches), names) for k, names in enumerate(batches, 1)),
    ]


def batch_capacity(size: int, out_of_service: int) -> int:
    """Turns a batch may run at once while ``out_of_service`` other nodes of the run are down: they
    count against the batch, at least one turn."""
    return max(1, size - out_of_service)


def plan_lines(groups: Sequence[TurnGroup], out_of_service: Mapping[str, str], size: int) -> list[str]:
    """The rollout as the plan lists it: what is out of service, then every group with its nodes, in order."""
    lines = []
    if out_of_service:
        down = ", ".join(f"{name} ({why})" for name, why in out_of_service.items())
        lines.append(f"out of service, counted against each batch they are not in (of {size}): {down}")
    lines += [f"{group.label}: {', '.join(group.nodes)}" for group in groups]
    return lines or ["no node takes a turn"]


def progress_line(turn: int, turns: int, group: TurnGroup, node: str, outcome: str, seconds: float, eta: str) -> str:
    """A turn's end, e.g. ``turn 3/6, batch 1/2: node-a17 done: … in 48 s; ETA 2 min``."""
    return f"turn {turn}/{turns}, {group.label}: {node} {outcome} in {seconds:.0f} s{eta}"


def eta_text(group_seconds: Sequence[float], groups_left: int) -> str:
    """``; ETA …`` from the mean time of the groups that ended so far; empty when nothing is left."""
    if not groups_left or not group_seconds:
        return ""
    left = statistics.fmean(group_seconds) * groups_left
    return f"; ETA {left / 60:.0f} min" if left >= 90 else f"; ETA {left:.0f} s"


def timing_line(turn_seconds: Mapping[str, float], groups: int, total: float) -> str:
    """The rollout's timing for the summary: turns, groups, median and longest turn, total."""
    if not turn_seconds:
        return f"rollout: no turn taken; {total:.0f} s in all"
    longest = max(turn_seconds, key=lambda name: turn_seconds[name])
    return (
        f"rollout: {len(turn_seconds)} turns in {groups} groups; median turn "
        f"{statistics.median(turn_seconds.values()):.0f} s, longest {turn_seconds[longest]:.0f} s ({longest}); "
        f"{total:.0f} s in all"
    )


def halt_lines(failed: Sequence[str], untouched: Sequence[str]) -> list[str]:
    """What a halted rollout left, and how to continue it."""
    return [
        f"rollout halted: failed: {', '.join(failed) or 'none'}; not touched: {', '.join(untouched) or 'none'}",
        "run the same command again to continue: converged nodes take no turn, a node caught mid-turn takes "
        "its turn first (restarted and verified, or rolled back), the rest follow in rollout order",
    ]


# A turn in progress is marked on its node (``TURN_MARKER``) from before its before-hook until its
# after-hook ended; a later run finds the mark of a turn that was cut off and takes that turn first.
TURN_MARKER = "/var/lib/pyinfra-gpunode/turn.json"
_BACKUP = re.compile(r"/var/lib/pyinfra-gpunode/backup/containerd-[0-9]{8}T[0-9]{6}\.[0-9]{6}Z\.tar")
MARKER_BYTES = 4096


@dataclass(frozen=True)
class TurnMark:
    """A turn cut off on this node: when it started, and the backup it took before writing (if it had)."""

    started: str
    backup: str | None = None
    backup_cri_problem: str | None = None


def turn_mark_text(started: str, backup: str | None = None, backup_cri_problem: str | None = None) -> str:
    return json.dumps({"started": started, "backup": backup, "backup_cri_problem": backup_cri_problem}) + "\n"


def parse_turn_mark(lines: Sequence[str]) -> tuple[TurnMark | None, str | None]:
    """The mark read from the node (untrusted): ``(mark, None)``, ``(None, None)`` when there is none, or
    ``(mark without a backup, why its content was not used)``: a node with a mark takes its turn
    either way, but a backup path or text that is not what this project writes is never used."""
    text = "\n".join(lines).strip()
    if not text:
        return None, None
    try:
        data = json.loads(text) if len(text) <= MARKER_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return TurnMark("unknown"), f"{TURN_MARKER} is not what gpunode writes: {shown(text, 80)}"
    started, backup, problem = data.get("started"), data.get("backup"), data.get("backup_cri_problem")
    started = started if isinstance(started, str) and re.fullmatch(r"[0-9TZ:.+-]{1,40}", started) else "unknown"
    if backup is not None and not (isinstance(backup, str) and _BACKUP.fullmatch(backup)):
        return TurnMark(started), f"{TURN_MARKER} names a backup gpunode does not write: {shown(str(backup), 80)}"
    if problem is not None and not (isinstance(problem, str) and len(problem) <= 1000 and problem.isprintable()):
        return TurnMark(started), f"{TURN_MARKER} holds an unreadable CRI finding: its backup is not used"
    return TurnMark(started, backup, problem), None


class OutcomeKind(Enum):
    """What a node's rollout came to; the value is how the log and the summary name it."""

    DONE = "done"  # its turn changed it (detail: what, e.g. "before-hook, containerd written")
    UNCHANGED = "unchanged"  # nothing disruptive to do, or its turn changed nothing
    FAILED = "failed"  # detail: why, and what the node was left with
    HALTED = "halted"  # no turn: the rollout stopped before it (detail: why)
    FILES_ONLY = "files only (gpunode_containerd_restart: none)"  # files written outside the turns
    NOT_IN_ORDER = "not in the rollout order"


_WITH_DETAIL = (OutcomeKind.DONE, OutcomeKind.FAILED, OutcomeKind.HALTED)


@dataclass(frozen=True)
class Outcome:
    """A node's rollout outcome: its ``kind`` and, for done, failed and halted, a ``detail``. ``str()`` is
    the text the log and the summary show, e.g. ``failed: before-hook kubectl exited 1; the node was not
    touched``."""

    kind: OutcomeKind
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}" if self.kind in _WITH_DETAIL else self.kind.value

    @classmethod
    def done(cls, did: Sequence[str]) -> Outcome:
        """A turn that did ``did`` (in order); unchanged when it did nothing."""
        return cls(OutcomeKind.DONE, ", ".join(did)) if did else cls(OutcomeKind.UNCHANGED)

    @classmethod
    def failed(cls, why: str) -> Outcome:
        return cls(OutcomeKind.FAILED, why)

    @classmethod
    def halted(cls, why: str) -> Outcome:
        return cls(OutcomeKind.HALTED, why)


UNCHANGED = Outcome(OutcomeKind.UNCHANGED)
FILES_ONLY = Outcome(OutcomeKind.FILES_ONLY)
NOT_IN_ORDER = Outcome(OutcomeKind.NOT_IN_ORDER)


@dataclass
class NodeReport:
    """What one run did to one node: the steps that changed, were skipped (and why), are pending."""

    changed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    rollout: str = "not reached"
    driver_ready: bool | None = None  # read once per run, by the first GPU step after the driver


SUMMARY_WIDTH = 100  # the summary fits a terminal this wide


def summary_table(reports: dict[str, NodeReport], width: int = SUMMARY_WIDTH) -> str:
    """One block per node, in the order given: the node and its rollout outcome, then what changed,
    was skipped and is pending (each only when there is any), wrapped to ``width`` columns."""
    lines: list[str] = []
    for name, report in reports.items():
        if len(name) + 2 > width // 2:  # a long name gets a line of its own (never cut)
            lines += [name, *_wrapped(report.rollout, width, " " * 4, " " * 6)]
        else:
            lines += _wrapped(report.rollout, width, f"{name}  ", " " * 6)
        for label, items, separator in (
            ("changed", report.changed, ", "),
            ("skipped", report.skipped, "; "),
            ("pending", report.pending, "; "),
        ):
            if items:
                lines += _wrapped(f"{label}: {separator.join(items)}", width, " " * 4, " " * 6)
    return "\n".join(lines)


def _wrapped(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` wrapped at spaces (a word longer than a line is cut) to lines of ``width`` columns at most."""
    return textwrap.wrap(text or "-", width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [
        first.rstrip()
    ]


class NodeSettings(TypedDict):
    """One node's part in the rollout, from its own host data."""

    runtime: dict[str, Any]  # containerd.nvidia_runtime arguments
    timeout: int  # seconds a restart may take
    restart: str  # "rolling" or "none" (files only)
    before: list[str]  # controller-side hook argv before the turn ([]: none)
    after: list[str]  # controller-side hook argv after the turn ([]: none)
    hook_timeout: float  # seconds each hook may run
    node_name: str | None  # the node's Kubernetes name from host data (None: the name the node reports)
    driver: list[str]  # the driver's disruptive changes planned for the turn ([]: none)
    driver_versions: tuple[str, str]  # the driver version the node runs before the turn and after ("": none)
    steps: Callable[[], object] | None  # adds the driver and the GPU steps after it, at the turn


def node_settings(nodes: Mapping[str, Mapping[str, Any]], name: str) -> NodeSettings:
    """``name``'s settings from ``nodes``; a node not listed takes the defaults."""
    given = nodes.get(name, {})
    return {
        "runtime": dict(given.get("runtime", {})),
        "timeout": int(given.get("timeout", RESTART_TIMEOUT)),
        "restart": str(given.get("restart", CONTAINERD_RESTART)),
        "before": list(given.get("before", [])),
        "after": list(given.get("after", [])),
        "hook_timeout": float(given.get("hook_timeout", HOOK_TIMEOUT)),
        "node_name": given.get("node_name"),
        "driver": list(given.get("driver", [])),
        "driver_versions": _versions(given.get("driver_versions")),
        "steps": given.get("steps"),
    }


def _versions(given: Any) -> tuple[str, str]:
    return (str(given[0]), str(given[1])) if given else ("", "")


def turn_changes(driver: Sequence[str], writes: Collection[str], restart_reason: str | None) -> list[str]:
    """What a node's turn is planned to change, one line each (the hooks get them in ``GPUNODE_CHANGES``)."""
    changes = list(driver)
    if writes:
        changes.append(f"containerd: write {', '.join(writes)}, restart and verify")
    elif restart_reason is not None:
        changes.append(f"containerd: restart ({restart_reason or 'pending'}) and verify")
    return changes


def unit_problem(service: Mapping[str, Any] | None) -> str | None:
    """
    Why containerd on this node cannot be restarted and verified as ``containerd.service``, or
    ``None``: no systemd, no such unit (naming where containerd runs instead), a socket-activated
    unit, or a containerd process outside the unit.
    """
    refused = "containerd is neither written nor restarted here (gpunode_containerd_restart: none writes files only)"
    if service is None:
        return f"systemd does not run this node (no /run/systemd/system): {refused}"
    processes = service.get("processes", [])
    found = ", ".join(f"pid {proc['pid']} in {proc['unit'] or 'no unit'}" for proc in processes)
    if service.get("load_state", "loaded") != "loaded":
        where = f"containerd runs as {found}" if processes else "no containerd process runs"
        return f"containerd.service is {service.get('load_state') or 'unknown'} ({where}): {refused}"
    if service.get("triggered_by"):
        return f"containerd.service is socket-activated by {', '.join(service['triggered_by'])}: {refused}"
    if any(proc["unit"] != "containerd.service" for proc in processes):
        return f"containerd runs outside containerd.service ({found}): {refused}"
    return None
