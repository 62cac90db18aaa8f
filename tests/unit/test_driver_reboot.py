"""The driver's reboot sequence in a run: after the node answers again, the node lock is taken again before
anything else runs on it, then the module gets time to load before the check."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, FunctionCommand, State, StringCommand
from pyinfra.api.inventory import Inventory
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.operations import _lock
from pyinfra_gpunode.operations.driver import MODULE_WAIT, _rebooted


@pytest.fixture
def run() -> State:
    state = State(inventory=Inventory(([("@fake/node", {})], {})), config=Config())
    state.is_executing = True
    return state


def _steps(run: State) -> list[str]:
    """What ``_rebooted`` yields, one name a step, as pyinfra would run it (each step before the next is asked for)."""
    node = run.inventory.get_host("@fake/node")
    steps = []
    with ctx_state.use(run), ctx_host.use(node):
        for command in _rebooted(600):
            assert isinstance(command, FunctionCommand | StringCommand)
            if isinstance(command, FunctionCommand):
                steps.append(command.function.__name__)
                continue
            text = command.get_raw_value()
            if _lock.LOCK in text:
                steps.append("lock")
            elif "systemctl reboot" in text:
                steps.append("reboot")
            elif "/sys/module/nvidia/version" in text and f"-lt {MODULE_WAIT}" in text:
                steps.append("module wait")
            else:
                steps.append(text)
    return steps


def test_a_held_lock_is_taken_again_right_after_the_node_is_back(run: State) -> None:
    with ctx_state.use(run), ctx_host.use(run.inventory.get_host("@fake/node")):
        list(_lock.take())  # the run took the node's lock before its first change
    assert _lock.holds(run, "@fake/node")
    assert _steps(run) == ["remember", "reboot", "back", "lock", "module wait"]
    assert _lock.holds(run, "@fake/node")


def test_a_node_whose_changes_take_no_lock_is_not_locked_after_its_reboot(run: State) -> None:
    assert _steps(run) == ["remember", "reboot", "back", "module wait"]
    assert not _lock.holds(run, "@fake/node")
