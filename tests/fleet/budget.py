"""How many nspawn hosts may be up at once on this machine, across every test process: each host's systemd,
dbus, getty and containerd hold about nine inotify instances, all charged to root, whose limit
(``fs.inotify.max_user_instances``, 128 by default) a host past it fails to boot under. Test processes
that share the module fleets (``scripts/test.sh``) boot fleets side by side; a fleet that would pass the
budget waits until another is down.

The fleet directories are the ledger: a host counts from the moment its state directory is made (under
the budget lock, ``Fleet.up``) until its fleet is down. A VM host runs a kernel of its own and counts
for nothing here.
"""

from __future__ import annotations

import fcntl
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .state import STATE_FILE

INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
# Measured 8 to 9 a host (systemd 5, dbus, getty, containerd 1 or 2; 82 in all with nine hosts up), and
# headroom for the daemons the chroot and real-binary tests start beside them.
INSTANCES_PER_HOST = 10
WAIT_LIMIT = 1800.0  # seconds a fleet waits for room before its boot fails

log = logging.getLogger(__name__)


class BudgetExceeded(RuntimeError):
    pass


def capacity(limit_file: Path = INOTIFY_LIMIT) -> int:
    """nspawn hosts the machine's inotify limit leaves room for (at least one)."""
    return max(1, int(limit_file.read_text()) // INSTANCES_PER_HOST)


def nspawn_hosts(fleets: Path, but: str | None = None) -> dict[str, int]:
    """nspawn hosts per fleet directory under ``fleets`` (up, booting or being torn down), fleet ``but`` left out."""
    counted: dict[str, int] = {}
    for state_file in sorted(fleets.glob(f"*/*/{STATE_FILE}")):
        fleet = state_file.parent.parent.name
        if fleet == but:
            continue
        try:
            is_vm = bool(json.loads(state_file.read_text()).get("vm"))
        except (OSError, ValueError):
            is_vm = False  # being written or removed: counted, to be safe
        if not is_vm:
            counted[fleet] = counted.get(fleet, 0) + 1
    return counted


@contextmanager
def room_for(
    fleet: str,
    hosts: int,
    fleets: Path,
    limit: Callable[[], int] = capacity,
    wait_limit: float = WAIT_LIMIT,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold the budget lock while ``fleet`` makes the state directories of its ``hosts`` new nspawn hosts,
    once the other fleets leave room for them; waits (lock released) while they do not."""
    fleets.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_limit
    waited = False
    with open(fleets.parent / "fleet-budget.lock", "w") as lock:
        while True:
            fcntl.flock(lock, fcntl.LOCK_EX)
            others = nspawn_hosts(fleets, but=fleet)
            room = limit()
            if hosts == 0 or sum(others.values()) + hosts <= room or not others:
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                return
            fcntl.flock(lock, fcntl.LOCK_UN)
            if not waited:
                log.info("fleet %s (%d nspawn hosts) waits for room: %s up, room for %d", fleet, hosts, others, room)
                waited = True
            if time.monotonic() > deadline:
                up = ", ".join(f"{name} ({count})" for name, count in others.items())
                raise BudgetExceeded(
                    f"fleet {fleet!r} needs {hosts} nspawn host(s) and the machine's inotify limit leaves room for "
                    f"{room} ({INOTIFY_LIMIT}: {INSTANCES_PER_HOST} a host); still up after {wait_limit:.0f} s: "
                    f"{up} (a run that ended without tearing its fleets down: python -m tests.fleet down --fleet NAME)"
                )
            sleep(1.0)
