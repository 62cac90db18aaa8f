"""operations/_internals.py against the installed pyinfra: one run on two @fake hosts in which an
operation on one host works on the other the way the rollout does. Each check names the pyinfra
attribute the module relies on, so a pyinfra release that changes it fails here, by name."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from pyinfra import host
from pyinfra.api import Config, State, StringCommand, operation
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.operations import server

from pyinfra_gpunode.operations._internals import (
    OP_CONTEXT,
    PYINFRA_ALL_GLOBAL_ARGUMENTS,
    PYINFRA_ARGUMENT_USERS,
    PYINFRA_OPERATION_MODULE,
    PYINFRA_POP_GLOBAL_ARGUMENTS,
    PYINFRA_POP_USERS,
    changed_operations,
    current_host,
    current_operation,
    current_state,
    failed_operation,
    first_failure,
    global_arguments,
    in_a_run,
    node_changes,
    on_host,
    operation_order,
    operation_result,
    outside_operation,
    pop_global_arguments,
    prepared_kept,
    runs_after_prepare,
    spawn,
)

SEEN: dict[str, Any] = {}


@operation(is_idempotent=False)
def conducted(other: str) -> Generator[Any, Any, None]:
    """Test operation: on ``@fake/a`` at execute, work on ``other`` as the rollout does."""
    yield StringCommand("true")
    if not current_state().is_executing or host.name != "@fake/a":
        return
    run, me = current_state(), current_host()
    node = run.inventory.get_host(other)
    SEEN["state"], SEEN["host"] = run, me
    SEEN["own_context"] = {name: getattr(me, name) for name in OP_CONTEXT}
    SEEN["current_operation"], SEEN["in_a_run"] = current_operation(), in_a_run()
    SEEN["spawned"] = spawn(run, lambda value: value * 2, 21).get()
    node.in_op = True  # as if ``node`` were inside this very operation, as the rollout's nodes are
    SEEN["other_before"] = {name: getattr(node, name) for name in OP_CONTEXT}
    with outside_operation(node), on_host(run, node):
        SEEN["inside_in_op"] = node.in_op
        SEEN["inside_host"] = current_host()
        SEEN["nested"] = server.shell(name="nested: ok", commands=["echo nested-ok"])
        try:
            server.shell(name="nested: fails", commands=["nested-fails"])
        except NestedOperationError as error:
            SEEN["failed"] = failed_operation(error)
            SEEN["stderr"] = operation_result(run, node, SEEN["failed"]).stderr
    SEEN["other_after"] = {name: getattr(node, name) for name in OP_CONTEXT}
    SEEN["host_after"] = current_host()


@pytest.fixture(scope="module")
def run() -> State:
    data = {
        "fake_delay": 0,
        "fake_delay_jitter": 0,
        "fake_responses": {"nested-fails": {"success": False, "stderr": ["nested failure"]}},
    }
    state = State(inventory=Inventory(([("@fake/a", data), ("@fake/b", data)], {})), config=Config())
    connect_all(state)
    try:
        add_op(state, server.shell, name="plain: changes", commands=["echo changed"])
        add_op(state, server.shell, name="plain: nothing to run", commands=[])
        add_op(state, conducted, name="conducted", other="@fake/b")
        run_ops(state)
    finally:
        disconnect_all(state)
    return state


def test_the_state_and_host_behind_the_context_proxies(run: State) -> None:
    assert SEEN.get("state") is run, "pyinfra.state._get_module() no longer returns the run's State"
    node = run.inventory.get_host("@fake/a")
    assert isinstance(SEEN.get("host"), Host) and SEEN["host"] is node, (
        "pyinfra.host._get_module() no longer returns the Host"
    )


def test_the_pool_runs_a_function_and_get_returns_its_value(run: State) -> None:
    assert SEEN.get("spawned") == 42, "State.pool.spawn(...).get() no longer returns the function's value"


def test_a_running_operation_sets_the_op_context_the_module_saves(run: State) -> None:
    context = SEEN.get("own_context", {})
    assert set(context) == set(OP_CONTEXT), "Host.in_op / current_op_* not readable"
    assert context["in_op"] is True, "Host.in_op is no longer True while the host's operation runs"
    assert context["current_op_hash"] in run.op_meta, "Host.current_op_hash no longer names the running operation"
    assert context["current_op_global_arguments"] is not None, "Host.current_op_global_arguments no longer set"


def test_outside_operation_lets_nested_operations_run_and_puts_the_context_back(run: State) -> None:
    assert SEEN.get("inside_in_op") is False, "Host.in_op not cleared inside outside_operation"
    assert SEEN.get("inside_host") is run.inventory.get_host("@fake/b"), "ctx_host.use() no longer sets pyinfra.host"
    assert SEEN["nested"].is_complete() and SEEN["nested"].did_succeed(), (
        "a nested operation on a host with Host.in_op False no longer runs at once"
    )
    assert SEEN.get("other_after") == SEEN["other_before"], "Host.in_op / current_op_* not put back after the block"
    assert SEEN.get("host_after") is run.inventory.get_host("@fake/a"), "ctx_host.use() no longer restores the host"


def test_a_failed_nested_operation_names_its_hash_and_its_stderr(run: State) -> None:
    assert SEEN.get("failed") in run.op_meta, "NestedOperationError.args[0] is no longer the operation's hash"
    assert "nested failure" in SEEN.get("stderr", ""), "State.ops[host][hash].operation_meta.stderr lost the output"


def test_changed_operations_names_the_completed_changes_in_order(run: State) -> None:
    assert changed_operations(run, run.inventory.get_host("@fake/a")) == ["plain: changes", "conducted"], (
        "State.ops[host] / State.op_meta[hash].names / OperationMeta.is_complete(), did_change() changed"
    )
    names = changed_operations(run, run.inventory.get_host("@fake/b"))
    assert names[0] == "plain: changes" and "nested: ok" in names and "nested: fails" not in names, names


def test_node_changes_counts_completed_changes_and_failures_nested_ones_included(run: State) -> None:
    assert node_changes(run, run.inventory.get_host("@fake/a")) == 2, (
        "OperationMeta.is_complete(), did_change(), did_succeed() or State.ops[host] changed"
    )
    # @fake/b: its own two changes, the nested one that ran and the nested one that failed
    assert node_changes(run, run.inventory.get_host("@fake/b")) == 4, (
        "nested operations (one changed, one failed) are no longer in State.ops[host]"
    )


def test_runs_after_prepare_is_the_clis_yes() -> None:
    inventory = Inventory((["@fake/c"], {}))
    assert runs_after_prepare(State(inventory=inventory, check_for_changes=False)), (
        "State.should_check_for_changes() no longer reports check_for_changes=False (the CLI's -y)"
    )
    assert not runs_after_prepare(State(inventory=Inventory((["@fake/d"], {})))), (
        "State.should_check_for_changes() is no longer True by default"
    )


def test_current_operation_names_the_running_operation_of_a_host_in_a_run(run: State) -> None:
    assert SEEN.get("in_a_run") is True, "pyinfra.host._get_module() is no longer a Host during a run"
    assert SEEN.get("current_operation") == SEEN["own_context"]["current_op_hash"] in run.op_meta, (
        "Host.current_op_hash no longer names the running operation"
    )


def test_first_failure_names_the_first_failed_operation_and_its_stderr(run: State) -> None:
    assert first_failure(run, run.inventory.get_host("@fake/a")) is None
    name, stderr = first_failure(run, run.inventory.get_host("@fake/b")) or ("", "")
    assert name == "nested: fails" and "nested failure" in stderr, (
        "State.ops[host] order, OperationMeta.did_succeed() or .stderr changed"
    )


def _two_ops() -> None:
    """Operation calls two frames deep, as a pipeline makes them from a deploy file."""
    server.shell(name="order: first", commands=["true"])
    for _ in range(2):  # one line, twice: pyinfra tells the calls apart by their count
        server.shell(name="order: looped", commands=["true"])


@pytest.mark.parametrize("deploy_file", [__file__, "/elsewhere/deploy.py", None], ids=["on-stack", "off", "none"])
def test_operation_order_is_pyinfras_own_for_the_same_stack(
    monkeypatch: pytest.MonkeyPatch, deploy_file: str | None
) -> None:
    """pyinfra orders operation calls by the call stack only in the CLI: called as the CLI calls them, from a
    deploy file that is on the stack, one that is not, and none."""
    import pyinfra
    from pyinfra.api import util
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_host, ctx_state

    seen: list[tuple[list[int], list[int]]] = []

    def both(state: State) -> list[int]:
        theirs, ours = util.get_operation_order_from_stack(state), operation_order(state)  # one line: one lineno
        seen.append((list(theirs), ours))  # pyinfra extends the list it gets
        return theirs

    monkeypatch.setattr(PYINFRA_OPERATION_MODULE, "get_operation_order_from_stack", both)
    monkeypatch.setattr(pyinfra, "is_cli", True)
    data = {"fake_delay": 0, "fake_delay_jitter": 0}
    state = State(inventory=Inventory(([("@fake/a", data)], {})), config=Config())
    state.current_deploy_filename, state.current_op_file_number = deploy_file, 3
    connect_all(state)
    try:
        state.set_stage(StateStage.Prepare)  # as the CLI does before it loads the deploy file
        with ctx_state.use(state), ctx_host.use(state.inventory.get_host("@fake/a")):
            _two_ops()
    finally:
        disconnect_all(state)
    assert len(seen) == 3 and all(theirs == ours for theirs, ours in seen), seen
    assert len({tuple(theirs) for theirs, _ in seen}) == (1 if deploy_file == "/elsewhere/deploy.py" else 2)


def test_the_pipelines_order_operations_by_one_frame_walk_and_read_the_global_arguments_once() -> None:

    import pyinfra_gpunode.pipelines  # noqa: F401  (installs it)

    assert PYINFRA_OPERATION_MODULE.get_operation_order_from_stack is operation_order
    assert all(module.all_global_arguments is global_arguments for module in PYINFRA_ARGUMENT_USERS)
    assert all(module.pop_global_arguments is pop_global_arguments for module in PYINFRA_POP_USERS)


def test_pop_global_arguments_is_pyinfras_own_from_every_source_of_host_data() -> None:
    """pyinfra's own function (kept before it is replaced) against ours, on a host whose global arguments come
    from each source ``host.data`` reads, first to last (override, host, group, inventory, deploy data), beside
    the deploy's keyword arguments and the call's own; a value is each caller's own copy, as pyinfra's is."""
    env = {"FROM": "group"}
    inventory = Inventory(
        ([("@fake/a", {"_sudo": True, "_timeout": 5})], {"_timeout": 99, "_env": {"FROM": "all"}, "_retries": 2}),
        override_data={"_sudo_user": "override"},
        gpu=(["@fake/a"], {"_env": env, "_retries": 3, "_sudo_user": "group"}),
    )
    state = State(inventory=inventory, config=Config())
    node = state.inventory.get_host("@fake/a")
    cases: list[dict[str, Any]] = [{}, {"_sudo": False, "name": "kept"}, {"_env": {"FROM": "call"}, "_retries": 7}]
    for deploy_kwargs, deploy_data in [(None, None), ({"_shell_executable": "bash"}, {"_retry_delay": 4})]:
        with node.deploy("d", kwargs=deploy_kwargs, data=deploy_data):  # type: ignore[arg-type]
            for call in cases:
                theirs_kwargs, ours_kwargs = dict(call), dict(call)
                theirs = PYINFRA_POP_GLOBAL_ARGUMENTS(state, node, theirs_kwargs)
                ours = pop_global_arguments(state, node, ours_kwargs)
                assert ours == theirs and ours_kwargs == theirs_kwargs, (call, deploy_kwargs)
                assert "_env" in call or ours[0]["_env"] is not env, "a host-data value must be the caller's copy"
    assert theirs[0]["_sudo_user"] == "override" and theirs[0]["_timeout"] == 5 and theirs[0]["_retry_delay"] == 4


def test_prepared_kept_freezes_what_is_alive_in_the_cli_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import pyinfra

    before = gc.get_freeze_count()
    try:
        monkeypatch.setattr(pyinfra, "is_cli", False)
        prepared_kept()
        assert gc.get_freeze_count() == before, "called from Python, nothing is frozen"
        monkeypatch.setattr(pyinfra, "is_cli", True)
        kept = [[index] for index in range(3)]  # lists: objects the collector tracks
        prepared_kept()
        assert gc.get_freeze_count() >= before + len(kept), "in the CLI, what is alive is frozen"
    finally:
        gc.unfreeze()


def test_global_arguments_are_pyinfras_own_and_a_new_list_each_call() -> None:
    """pyinfra's own function (kept before it is replaced), against the one worked out once; a caller that
    changes the list it got does not change the next caller's."""
    theirs = PYINFRA_ALL_GLOBAL_ARGUMENTS()
    assert global_arguments() == theirs
    got = global_arguments()
    got.clear()
    assert global_arguments() == theirs
    assert {name for name, _ in theirs} >= {"_sudo", "_serial", "_if", "_retries"}
