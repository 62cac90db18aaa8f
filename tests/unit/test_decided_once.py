"""Each step decides once per node read (``operations._shared.decided_once``), on a @fake host of a real
pyinfra run: the driver step's operation, its read-only twin (``driver_changes``) and the deploy's summary
(``driver.decision``) share one decision, so the package index is read once, not by each; after a command of
the operation ran, the node is read and decided again. Pure decisions are checked in ``test_driver_plan``."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

from pyinfra.api import Config, Inventory, State, StringCommand, operation
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.driver_plan import DriverRequest, check_request, host_info, wanted_names
from pyinfra_gpunode.facts.driver import NvidiaHostState
from pyinfra_gpunode.facts.kernel import NOUVEAU_CONF
from pyinfra_gpunode.facts.node import PART, NodeSnapshot
from pyinfra_gpunode.facts.package_index import NvidiaAptVersions
from pyinfra_gpunode.operations import driver
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import DEFAULT_BINARY
from pyinfra_gpunode.settings import DriverSettings

TESTS = Path(__file__).resolve().parents[1]
SEEN: dict[str, Any] = {}
# Packages from branch 580 over the H200 node's runfile driver: no package installed, so the plan needs the
# package index (``apt-cache madison``) to pick the versions.
WANTED = DriverSettings(source="packages", branch="580", replace_preinstalled=True)


def fixture(fact: str, name: str) -> dict[str, Any]:
    return dict(json.loads((TESTS / "facts" / fact / f"{name}.json").read_text()))


HOST_STATE = fixture("driver.NvidiaHostState", "h200_ubuntu_preinstalled")
SNAPSHOT = [
    *(f"{PART}kind", *fixture("node.NodeKind", "h200_ubuntu")["output"]),
    *(f"{PART}prep", *fixture("kernel.HostPrepState", "ubuntu_held_blacklisted_loaded")["output"]),
    *(f"{PART}readiness", *fixture("readiness.NodeReadiness", "h200_ubuntu2404_preinstalled")["output"]),
]
NAMES = wanted_names(host_info(HOST_STATE["fact"]), check_request(DriverRequest(branch="580")))
INDEX = NvidiaAptVersions().command(packages=NAMES)


@operation()
@locked_before_changes
def decided_around_a_change() -> Generator[Any, Any, None]:
    """Test operation: the driver's decision asked for by each of its users, then again after a command."""
    SEEN["first"] = driver.decision(WANTED)
    SEEN["changes"] = driver.driver_changes(source="packages", branch="580", replace_preinstalled=True)
    SEEN["again"] = driver.decision(WANTED)
    SEEN["other"] = driver.decision(DriverSettings(source="packages", branch="580"))  # other arguments
    yield StringCommand("echo", "a change")
    SEEN["after"] = driver.decision(WANTED)


@operation()
def source_only() -> Generator[Any, Any, None]:
    """Test operation: the driver's source and state only, as the deploy's summary asks for them."""
    SEEN["source"] = driver.decision(WANTED, planned=False)
    yield from ()


def run(op: Any = decided_around_a_change) -> list[str]:
    """Run a test operation as ``pyinfra -y`` does on one @fake host; the commands it was sent."""
    SEEN.clear()
    responses = {
        NodeSnapshot().command(DEFAULT_BINARY, NOUVEAU_CONF): SNAPSHOT,
        NvidiaHostState().command(): HOST_STATE["output"],
        INDEX: [],  # the index offers nothing: the plan fails naming the packages
    }
    data = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0}
    state = State(inventory=Inventory(([("@fake/gpu1", data)], {})), config=Config(), check_for_changes=False)
    connect_all(state)
    try:
        add_op(state, op, name="driver decided")
        run_ops(state)
        node = state.inventory.get_host("@fake/gpu1")
        commands: list[str] = node.connector.executed_commands  # type: ignore[attr-defined]
    finally:
        disconnect_all(state)
    return [str(command) for command in commands]


def test_one_decision_per_read_serves_the_operation_its_twin_and_the_summary() -> None:
    commands = run()
    assert SEEN["again"] is SEEN["first"], "asked again on the same read, the driver step decided again"
    assert SEEN["first"].source == "packages" and "580" in SEEN["first"].error, SEEN["first"]
    assert SEEN["changes"] == ([], ("", ""))  # a node the step fails has no change for its turn
    assert SEEN["other"] is not SEEN["first"] and "not installed from packages" in SEEN["other"].error
    assert SEEN["after"] is not SEEN["first"], "after a command the decision came from the read before it"
    # The snapshot, the index once for the first read, the echo, the node's driver read again, the index again.
    assert commands == [commands[0], INDEX, "echo a change", NvidiaHostState().command(), INDEX], commands


def test_the_source_alone_reads_no_package_index() -> None:
    commands = run(source_only)
    assert SEEN["source"].source == "packages" and SEEN["source"].index == tuple(NAMES)
    assert INDEX not in commands, commands
