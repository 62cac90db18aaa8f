"""containerd's support windows: whether a node's containerd line is past its end of support (no I/O).

Source: containerd's release table, ``RELEASES.md`` on containerd's main branch at 301026e5 (2026-08-22),
"End of Life" column; a month without a day is read as its last day. 2.4's end is tentative there. A line
past its end still works: the plan and the readiness report warn, nothing is refused.
"""

from __future__ import annotations

from datetime import date

from pyinfra_gpunode.log import printable
from pyinfra_gpunode.versions import ContainerdVersionInfo

SOURCE = "containerd RELEASES.md (main at 301026e5, 2026-08-22)"
END_OF_SUPPORT: dict[tuple[int, int], date] = {
    (1, 5): date(2023, 2, 28),
    (1, 6): date(2025, 8, 23),
    (1, 7): date(2026, 9, 30),  # "September 2026": extended support for GKE's Kubernetes 1.30-1.32
    (2, 0): date(2027, 3, 31),  # "March, 2027": extended support for GKE's Kubernetes 1.33
    (2, 1): date(2026, 7, 3),
    (2, 2): date(2026, 11, 6),
    (2, 3): date(2028, 4, 30),  # LTS
    (2, 4): date(2027, 4, 26),  # tentative
}
OLDEST = min(END_OF_SUPPORT)


def support_warning(version: ContainerdVersionInfo | None, today: date) -> str | None:
    """A warning where ``version``'s line is past its end of support on ``today``, else ``None`` (also for a
    line newer than the table, or no containerd). The version as the node printed it is shown printable."""
    if version is None:
        return None
    line = (version["major"], version["minor"])
    end = END_OF_SUPPORT.get(line)
    if end is None and line > OLDEST:
        return None
    if end is not None and today <= end:
        return None
    since = f" since {end.isoformat()}" if end else ""
    supported = ", ".join(
        f"{major}.{minor}" for (major, minor), last in sorted(END_OF_SUPPORT.items()) if last >= today
    )
    return (
        f"containerd {printable(version['raw'])}: the {line[0]}.{line[1]} line is past its end of support{since} "
        f"({SOURCE}); supported lines: {supported or 'none in the table'}; this is a warning, not a refusal"
    )
