"""operations/_shared.py on a @fake host of a real pyinfra run: a part of the node snapshot asked for after
a command of the operation asking ran is read again from the node, not taken from the snapshot read
before that command; an operation that declared ``facts_unchanged`` keeps the snapshot, and so does a
nested operation's change check (it runs no command)."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

from pyinfra.api import Config, Inventory, State, StringCommand, operation
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.facts.gpus import NvidiaGpus
from pyinfra_gpunode.facts.kernel import NOUVEAU_CONF
from pyinfra_gpunode.facts.node import PART, NodeSnapshot
from pyinfra_gpunode.operations._internals import current_host, current_state, on_host, outside_operation
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import DEFAULT_BINARY, earlier_read, facts_unchanged, node_fact

TESTS = Path(__file__).resolve().parents[1]
SEEN: dict[str, Any] = {}


def output(fact: str, name: str) -> list[str]:
    return list(json.loads((TESTS / "facts" / fact / f"{name}.json").read_text())["output"])


# The snapshot finds the H200 of an Ubuntu node; read on its own afterwards, the PCI bus shows no GPU.
SNAPSHOT = [
    *(f"{PART}kind", *output("node.NodeKind", "h200_ubuntu")),
    *(f"{PART}prep", *output("kernel.HostPrepState", "ubuntu_held_blacklisted_loaded")),
    *(f"{PART}readiness", *output("readiness.NodeReadiness", "h200_ubuntu2404_preinstalled")),
]
GPUS_NOW = output("gpus.NvidiaGpus", "no_gpu")


@operation()
@locked_before_changes
def gpus_read_around_a_change(unchanging: bool = False) -> Generator[Any, Any, None]:
    """Test operation: the node's GPUs before and after a command it yields."""
    if unchanging:
        facts_unchanged()
    SEEN["before"] = node_fact(NvidiaGpus)
    yield StringCommand("echo", "a change")
    SEEN["earlier"] = earlier_read(NvidiaGpus)
    SEEN["after"] = node_fact(NvidiaGpus)


@operation()
def conducting() -> Generator[Any, Any, None]:
    """Test operation: at execute, the test operation nested, as the rollout runs a node's steps."""
    if current_state().is_executing:
        node = current_host()
        with outside_operation(node), on_host(current_state(), node):
            gpus_read_around_a_change(name="nested: gpus read around a change")
    yield from ()


def run(unchanging: bool = False, nested: bool = False) -> list[str]:
    """Run the test operation (``nested``: within another, checking for changes as pyinfra does without
    ``-y``; else as ``pyinfra -y`` does) on one @fake host; the commands it was sent."""
    SEEN.clear()
    responses = {
        NodeSnapshot().command(DEFAULT_BINARY, NOUVEAU_CONF): SNAPSHOT,  # first: it holds the PCI script too
        NvidiaGpus().command(): GPUS_NOW,
    }
    data = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0}
    inventory = Inventory(([("@fake/gpu1", data)], {}))
    state = State(inventory=inventory, config=Config(), check_for_changes=nested)
    connect_all(state)
    try:
        if nested:
            add_op(state, conducting, name="conducting")
        else:
            add_op(state, gpus_read_around_a_change, name="gpus read around a change", unchanging=unchanging)
        run_ops(state)
        node = state.inventory.get_host("@fake/gpu1")
        assert not state.failed_hosts
        commands: list[str] = node.connector.executed_commands  # type: ignore[attr-defined]
    finally:
        disconnect_all(state)
    return [str(command) for command in commands]


def test_a_part_asked_for_after_a_command_is_read_again_not_taken_from_the_snapshot() -> None:
    commands = run(unchanging=False)
    assert [gpu["device"] for gpu in SEEN["before"]["gpus"]] == ["0x2335"]  # from the snapshot
    assert SEEN["after"]["gpus"] == [], "the GPUs after the command came from the snapshot read before it"
    assert len(commands) == 3 and NvidiaGpus().command() == commands[2], commands  # snapshot, echo, PCI
    assert SEEN["earlier"] == SEEN["before"]  # asked for what no change here touches: the read before, no command


def test_an_operation_that_changes_nothing_read_keeps_the_snapshot() -> None:
    commands = run(unchanging=True)
    assert SEEN["after"] == SEEN["before"]
    assert len(commands) == 2, commands  # the snapshot and the echo


def test_a_nested_operations_change_check_runs_no_command_and_keeps_the_snapshot() -> None:
    """pyinfra runs a nested operation up to its first command to see whether it changes anything, then
    runs it: the first run sends no command, so the second still takes its first read from the snapshot."""
    commands = run(nested=True)
    assert [gpu["device"] for gpu in SEEN["before"]["gpus"]] == ["0x2335"] and SEEN["after"]["gpus"] == []
    assert len(commands) == 3 and NvidiaGpus().command() == commands[2], commands  # snapshot, echo, PCI
