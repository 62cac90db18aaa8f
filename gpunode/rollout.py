"""Rollout order and the per-node report of a run (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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


def summary_table(reports: dict[str, NodeReport]) -> str:
    """A plain-text table, one row per node, in the order given."""
    header = ("node", "rollout", "changed", "skipped", "pending")
    rows = [
        (
            name,
            report.rollout,
            ", ".join(report.changed) or "-",
            "; ".join(report.skipped) or "-",
            "; ".join(report.pending) or "-",
        )
        for name, report in reports.items()
    ]
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in (header, *rows)]
    return "\n".join(lines)
