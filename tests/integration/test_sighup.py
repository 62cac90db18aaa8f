"""SIGHUP ends containerd (it has no reload); systemd brings it back after RestartSec with a new PID.

The rollout relies on this: a HUP is a restart, not a reload, on containerd 1.7 and 2.3 alike.
"""

from __future__ import annotations

import time

import pytest

from tests.fleet import Fleet

pytestmark = pytest.mark.fleet


def _service(fleet: Fleet, host: str) -> dict[str, str]:
    output = fleet.run(
        host, "systemctl show containerd -p MainPID -p NRestarts -p ActiveState -p Restart -p RestartUSec"
    ).stdout
    return dict(line.split("=", 1) for line in output.splitlines())


@pytest.mark.parametrize("host", ["node1", "node3"])
def test_sighup_restarts_containerd_after_restart_sec(fleet: Fleet, host: str) -> None:
    fleet.reset([host])
    before = _service(fleet, host)
    assert (before["ActiveState"], before["Restart"], before["RestartUSec"]) == ("active", "always", "5s")
    since = fleet.run(host, "date +%s.%N").stdout.strip()

    sent = time.monotonic()
    assert fleet.run(host, "systemctl kill -s HUP containerd").returncode == 0
    deadline = sent + 30
    while time.monotonic() < deadline:
        after = _service(fleet, host)
        if after["ActiveState"] == "active" and after["MainPID"] not in ("0", before["MainPID"]):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"containerd did not come back on {host}: {_service(fleet, host)}")
    assert time.monotonic() - sent >= 4.5, "restarted before RestartSec (5 s) passed"
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1

    journal = fleet.run(host, f"journalctl -u containerd -o cat --no-pager --since @{since}").stdout
    assert f"Sent signal SIGHUP to main process {before['MainPID']} (containerd)" in journal
    assert "Scheduled restart job, restart counter is at" in journal
