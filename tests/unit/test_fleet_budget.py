"""tests/fleet/budget.py: fleets booted side by side stay within the machine's inotify budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fleet.budget import BudgetExceeded, capacity, nspawn_hosts, room_for


def host(fleets: Path, fleet: str, name: str, vm: bool = False) -> None:
    directory = fleets / fleet / name
    directory.mkdir(parents=True)
    (directory / "host.json").write_text(json.dumps({"name": name, "vm": vm}))


def test_capacity_is_the_inotify_limit_over_a_hosts_share(tmp_path: Path) -> None:
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    assert capacity(limit) == 12
    limit.write_text("8\n")
    assert capacity(limit) == 1


def test_nspawn_hosts_are_counted_per_fleet_vms_and_the_asking_fleet_left_out(tmp_path: Path) -> None:
    host(tmp_path, "default", "node1")
    host(tmp_path, "default", "node2")
    host(tmp_path, "vm", "vm1", vm=True)
    host(tmp_path, "batches", "bt1")
    (tmp_path / "batches" / "bt2").mkdir()  # no state yet: not a host
    assert nspawn_hosts(tmp_path) == {"batches": 1, "default": 2}
    assert nspawn_hosts(tmp_path, but="batches") == {"default": 2}


def test_a_fleet_that_fits_goes_at_once(tmp_path: Path) -> None:
    fleets = tmp_path / "fleets"
    host(fleets, "default", "node1")
    slept: list[float] = []
    with room_for("turns", 3, fleets, limit=lambda: 4, sleep=slept.append):
        host(fleets, "turns", "tn1")
    assert slept == []


def test_a_fleet_past_the_budget_waits_until_another_is_down(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fleets = tmp_path / "fleets"
    for name in ("bt1", "bt2", "bt3"):
        host(fleets, "batches", name)
    host(fleets, "default", "node1")
    slept: list[float] = []

    def batches_go_down(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            shutil.rmtree(fleets / "batches")

    caplog.set_level("INFO", logger="tests.fleet.budget")
    with room_for("turns", 3, fleets, limit=lambda: 5, sleep=batches_go_down):
        assert not (fleets / "batches").exists()
    assert len(slept) == 3
    assert caplog.messages == [
        "fleet turns (3 nspawn hosts) waits for room: {'batches': 3, 'default': 1} up, room for 5"
    ]


def test_a_fleet_that_never_finds_room_fails_naming_the_fleets_up(tmp_path: Path) -> None:
    fleets = tmp_path / "fleets"
    host(fleets, "stale", "old1")
    with pytest.raises(BudgetExceeded, match=r"fleet 'turns' needs 3 .* room for 2 .* stale \(1\)"):
        with room_for("turns", 3, fleets, limit=lambda: 2, wait_limit=0, sleep=lambda _: None):
            pass


def test_a_fleet_alone_may_be_larger_than_the_budget(tmp_path: Path) -> None:
    """Nothing to wait for: a fleet alone larger than the budget boots (bench/scale.py raises the limit)."""
    fleets = tmp_path / "fleets"
    host(fleets, "vm", "vm1", vm=True)
    with room_for("scale-big", 30, fleets, limit=lambda: 11, wait_limit=0, sleep=lambda _: None):
        pass
