"""When this run takes and renews a node lock: the first change takes it, later changes renew it once half
of the time a holder keeps an unrenewed lock has passed, and a dry run takes nothing."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.operations import _lock
from pyinfra_gpunode.operations._lock import HOLD_S, LOCK, renewal_due


@pytest.mark.parametrize(
    ("elapsed", "due"),
    [(0, False), (HOLD_S / 2 - 1, False), (HOLD_S / 2, True), (HOLD_S - 1, True), (HOLD_S * 10, True)],
)
def test_a_lock_is_renewed_once_half_its_hold_has_passed(elapsed: float, due: bool) -> None:
    assert renewal_due(taken=100.0, now=100.0 + elapsed) is due


def test_a_holder_keeps_an_unrenewed_lock_one_hour() -> None:
    assert HOLD_S == 3600  # the bound documented for a lock whose controller died
    assert renewal_due(taken=0.0, now=30.0, hold_s=60) and not renewal_due(taken=0.0, now=29.0, hold_s=60)


def test_a_run_takes_its_lock_once_and_renews_it_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = Inventory((["node1"], {}))
    run = State(inventory, Config())
    clock = [1000.0]
    monkeypatch.setattr(_lock.time, "monotonic", lambda: clock[0])

    def commands() -> list[str]:
        with ctx_state.use(run), ctx_host.use(inventory.get_host("node1")):
            return [command.get_raw_value() for command in _lock.take()]

    assert commands() == []  # not executing: a dry run takes nothing
    run.is_executing = True
    (first,) = commands()
    assert f" {LOCK} " in first and first.endswith(f" {HOLD_S}")
    clock[0] += HOLD_S / 2 - 1
    assert commands() == []
    clock[0] += 1
    assert commands() == [first]  # the same program, holder and lock: it renews the lock
    clock[0] += HOLD_S / 2 - 1
    assert commands() == []


def test_a_turn_removes_its_mark_and_releases_the_lock_in_one_command() -> None:
    """The turn's last command: the mark removed and, where this run holds the node lock, the lock released
    in the same command (one round trip); without ``release_lock``, or with no lock held, the mark alone."""
    from pyinfra_gpunode.operations.rollout import turn_unmarked
    from pyinfra_gpunode.rollout import TURN_MARKER

    inventory = Inventory((["node1"], {}))
    run = State(inventory, Config())
    run.is_executing = True

    def commands(**arguments: bool) -> list[str]:
        with ctx_state.use(run), ctx_host.use(inventory.get_host("node1")):
            return [command.get_raw_value() for command in turn_unmarked._inner(**arguments)]  # type: ignore[attr-defined]

    unmark = f"rm -f {TURN_MARKER}"
    assert commands(release_lock=True) == [unmark]  # no lock held
    with ctx_state.use(run), ctx_host.use(inventory.get_host("node1")):
        list(_lock.take())
    assert commands() == [unmark] and _lock.holds(run, "node1")
    (both,) = commands(release_lock=True)
    assert both.startswith(f"{unmark} && sh -c ") and f" {LOCK} " in both
    assert not _lock.holds(run, "node1")
