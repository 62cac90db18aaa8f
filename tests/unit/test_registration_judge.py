"""``operations/_registration.py``: the registration judged from a node's reads alone, each read asked for
by name (once, the judgement going on with its value), and what the step says carried in the result
instead of logged."""

from __future__ import annotations

import ast
import inspect
import json
import logging
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from pyinfra_gpunode.operations._registration import Read, Registration, RuntimeArguments, judgement, settled
from pyinfra_gpunode.operations.containerd import bound_arguments, nvidia_runtime

REPO = Path(__file__).resolve().parents[2]
FIXTURES = sorted((REPO / "tests/operations/containerd.nvidia_runtime").glob("*.json"))
BINARY = "/usr/bin/nvidia-container-runtime"


def fixture(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads((REPO / "tests/operations/containerd.nvidia_runtime" / f"{name}.json").read_text())
    return data["kwargs"], data["facts"]["containerd.ContainerdNodeState"][f"binary={BINARY}"]


class Unserved(Exception):
    pass


def settle(arguments: dict[str, Any], values: dict[Read, Any]) -> tuple[Registration | Read, list[Read]]:
    """Judge serving only the reads in ``values``: the registration, or the first read ``values`` lacks; the
    reads asked for, in order."""
    asked: list[Read] = []

    def serve(read: Read) -> Any:
        assert read not in asked, f"{read} asked for again"
        asked.append(read)
        if read not in values:
            raise Unserved(read)
        return values[read]

    try:
        return settled(judgement(arguments), serve), asked
    except Unserved as unserved:
        return unserved.args[0], asked


def test_the_judgement_does_no_io_of_its_own() -> None:
    """No pyinfra state, host or logger in the module: its reads go through ``Read``, its messages into ``said``."""
    tree = ast.parse((REPO / "operations/_registration.py").read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not [name for name in imported if name.split(".")[0] in ("pyinfra", "subprocess", "os")], imported
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"host", "state", "logger", "open", "print"}


def test_a_node_is_read_first_and_judged_from_that_read() -> None:
    kwargs, node = fixture("converged")
    arguments = bound_arguments(**kwargs)
    assert next(judgement(arguments)) == Read("node", (("binary", BINARY),))
    found, asked = settle(arguments, {Read("node", (("binary", BINARY),)): node})
    assert asked == [Read("node", (("binary", BINARY),))]
    assert isinstance(found, Registration)
    assert (found.problem, found.writes, found.said) == (None, {}, [])


def test_a_platform_node_is_refused_from_its_first_read() -> None:
    kwargs, node = fixture("k3s_owned")
    found, asked = settle(bound_arguments(**kwargs), {Read("node", (("binary", BINARY),)): node})
    assert [read.fact for read in asked] == ["node"]
    assert isinstance(found, Registration)
    assert found.problem and "k3s" in found.problem and not found.writes


def test_a_missing_binary_is_said_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    kwargs, node = fixture("binary_required_missing")
    caplog.set_level(logging.DEBUG)
    reads = {Read("node", (("binary", BINARY),)): node}
    required, _ = settle(bound_arguments(**kwargs), reads)
    assert isinstance(required, Registration)
    assert required.problem == (
        f"containerd config not changed: nvidia runtime binary {BINARY} is missing on the node "
        "(gpunode_runtime_binary_required)"
    )
    judged, _ = settle(bound_arguments(), reads)
    assert isinstance(judged, Read), "with the binary not required, the judgement goes on to the candidate"
    assert judged.fact == "candidate"
    assert dict(judged.arguments)["dropin_path"] == "/etc/containerd/gpunode/nvidia-runtime.toml"
    assert caplog.records == []


def test_every_fixture_node_is_judged_the_same_twice() -> None:
    """Deterministic: the same reads give the same registration (or the same next read)."""
    for path in FIXTURES:
        data = json.loads(path.read_text())
        if data.get("exception"):
            continue
        node = data["facts"]["containerd.ContainerdNodeState"][f"binary={BINARY}"]
        arguments = bound_arguments(**data["kwargs"])
        reads = {Read("node", (("binary", BINARY),)): node}
        assert settle(arguments, reads) == settle(arguments, reads), path.name


def test_unknown_arguments_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="binaryname"):
        bound_arguments(binaryname=BINARY)


def test_the_judgement_takes_the_operations_arguments_by_name_and_type() -> None:
    # The operation's signature holds the defaults; the judgement's argument type names the same, typed the same.
    parameters = inspect.signature(nvidia_runtime).parameters
    declared = get_type_hints(RuntimeArguments)
    assert list(declared) == list(parameters)
    operation_hints = get_type_hints(inspect.unwrap(nvidia_runtime))
    assert {name: operation_hints[name] for name in parameters} == declared
    assert bound_arguments() == {name: parameter.default for name, parameter in parameters.items()}
