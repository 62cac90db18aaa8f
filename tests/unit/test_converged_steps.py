"""operations/converged.py on a pyinfra @fake host: a group of steps none of which has anything to do is
one operation in the CLI, each step its own where one has, and always from Python; the one operation
runs each step's body again when it executes; the probe prints nothing."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from pyinfra import host
from pyinfra.api import Config, State, StringCommand, operation
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.inventory import Inventory
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._shared import read_afresh
from pyinfra_gpunode.operations.converged import Step, taken

TO_DO: dict[str, bool] = {"first": False, "second": False}
ASKED: list[str] = []  # each step's body, as it is run


@operation()
def first_step() -> Generator[Any, Any, None]:
    """Test operation: a command where ``TO_DO["first"]``, else a noop and a plan warning."""
    ASKED.append("first")
    if TO_DO["first"]:
        yield StringCommand("echo", "first")
        return
    logger.warning("%splan: first step warned", host.print_prefix)
    host.noop("first step: nothing to do")


@operation()
def second_step(word: str = "second") -> Generator[Any, Any, None]:
    """Test operation: a command where ``TO_DO["second"]``."""
    ASKED.append("second")
    if TO_DO["second"]:
        yield StringCommand("echo", word)
        return
    host.noop("second step: nothing to do")


GROUP = [Step(first_step, "first: done"), Step(second_step, "second: done", {"word": "two"})]


@pytest.fixture(params=[True, False], ids=["checks-changes", "yes"])
def run(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[State]:
    """A state on one @fake host in its prepare stage, its context set, ``pyinfra.is_cli`` as the CLI sets it;
    checking for changes before it executes, or not (the CLI's ``-y``: it executes on the plan's reads)."""
    import pyinfra

    monkeypatch.setattr(pyinfra, "is_cli", True)
    monkeypatch.setitem(TO_DO, "first", False)
    monkeypatch.setitem(TO_DO, "second", False)
    ASKED.clear()
    inventory = Inventory(([("@fake/a", {"fake_delay": 0, "fake_delay_jitter": 0})], {}))
    state = State(inventory=inventory, config=Config(), check_for_changes=request.param)
    state.current_deploy_filename, state.current_op_file_number = None, 0
    connect_all(state)
    try:
        state.set_stage(StateStage.Prepare)
        with ctx_state.use(state), ctx_host.use(state.inventory.get_host("@fake/a")):
            yield state
    finally:
        disconnect_all(state)


def _names(state: State) -> list[str]:
    return sorted(name for meta in state.op_meta.values() for name in meta.names)


def test_a_group_with_nothing_to_do_is_one_operation(run: State) -> None:
    taken(GROUP)
    assert _names(run) == ["first: done; second: done"]


def test_a_group_with_one_change_is_an_operation_per_step(run: State) -> None:
    TO_DO["second"] = True
    taken(GROUP)
    assert _names(run) == ["first: done", "second: done"]


def test_from_python_each_step_is_its_own_operation(run: State, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyinfra

    monkeypatch.setattr(pyinfra, "is_cli", False)  # pyinfra then tells operations apart by their count per node
    taken(GROUP)
    assert _names(run) == ["first: done", "second: done"]


def test_the_one_operation_runs_each_steps_body_again_when_it_executes_on_other_reads(run: State) -> None:
    taken(GROUP)
    read_afresh(run, "@fake/a")  # the plan's reads no longer hold
    TO_DO["second"] = True  # and the node changed between the plan and the run
    with ctx_state.use(run):
        run_ops(run)
    node = run.inventory.get_host("@fake/a")
    (meta,) = [data.operation_meta for data in run.ops[node].values()]
    assert meta.did_change() and meta.did_succeed(), meta  # the second step's command ran in it


def test_on_the_plans_reads_the_one_operation_says_what_the_steps_said_without_asking_them_again(
    run: State, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        taken(GROUP)
        asked_at_plan = list(ASKED)
        with ctx_state.use(run):
            run_ops(run)
    node = run.inventory.get_host("@fake/a")
    (meta,) = [data.operation_meta for data in run.ops[node].values()]
    assert meta.did_succeed() and not meta.did_change(), meta
    warned = [record for record in caplog.records if "first step warned" in record.getMessage()]
    assert asked_at_plan == ["first", "second"], "asked again on the plan's reads"
    assert "[@fake/a] plan: first step warned" in warned[0].getMessage()
    if run.should_check_for_changes():  # said at the plan's change check; executing on reads of its own: asked
        assert ASKED == ["first", "second"] * 2 and len(warned) == 2
    else:  # said once, when it executes
        assert ASKED == asked_at_plan and len(warned) == 1


def test_a_step_whose_condition_says_no_when_it_executes_is_skipped_inside_the_one_operation(
    run: State, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[bool] = []

    def no() -> bool:
        asked.append(False)
        return False

    group = [GROUP[0], Step(second_step, "second: done", {"word": "two"}, no)]
    with caplog.at_level(logging.DEBUG):
        taken(group)
        read_afresh(run, "@fake/a")
        TO_DO["second"] = True  # it would change the node, but its condition says no
        with ctx_state.use(run):
            run_ops(run)
    node = run.inventory.get_host("@fake/a")
    (meta,) = [data.operation_meta for data in run.ops[node].values()]
    assert meta.did_succeed() and not meta.did_change(), meta
    assert asked == [False], "the condition is asked when the operation executes, once"
