"""Rollout order and the per-node report of a run (no I/O)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from pyinfra_gpunode.hostdata import HostDataError


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
    driver: list[str]  # the driver's disruptive changes planned for the turn ([]: none)
    steps: Callable[[], object] | None  # adds the driver and the GPU steps after it, at the turn


def node_settings(nodes: Mapping[str, Mapping[str, Any]], name: str) -> NodeSettings:
    """``name``'s settings from ``nodes``; a node not listed takes the defaults."""
    given = nodes.get(name, {})
    return {
        "runtime": dict(given.get("runtime", {})),
        "timeout": int(given.get("timeout", 60)),
        "restart": str(given.get("restart", "rolling")),
        "before": list(given.get("before", [])),
        "after": list(given.get("after", [])),
        "hook_timeout": float(given.get("hook_timeout", 600)),
        "driver": list(given.get("driver", [])),
        "steps": given.get("steps"),
    }


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
