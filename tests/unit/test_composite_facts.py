"""Each composite fact's declared parts (``parts``) agree with its command and with what its ``process``
returns for real outputs: every part is in the value under its name, as the part's fact makes it of the
part's lines, and every part's command (with the arguments the declaration derives) is in the composite's
command. The reads one node shares between operations find the facts a read holds through these
declarations (``operations/_shared.py``)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.facts import node, readiness
from pyinfra_gpunode.facts._composite import Fact, Part, composites, holders, parts_of
from pyinfra_gpunode.facts.containerd import ContainerdNodeState
from pyinfra_gpunode.facts.driver import NvidiaHostState
from pyinfra_gpunode.facts.kernel import PREP_PART, HostPrepState
from pyinfra_gpunode.facts.node import KIND_PART, NodeKind, NodeSnapshot
from pyinfra_gpunode.facts.readiness import NodeReadiness
from pyinfra_gpunode.sections import split_parts, split_sections

TESTS = Path(__file__).resolve().parents[1]
COMPOSITES = composites(NodeSnapshot)
# The line before each part of the composites that join their parts (``join_parts``).
PREFIXES: dict[Fact, str] = {
    NodeSnapshot: node.PART,
    NodeKind: KIND_PART,
    HostPrepState: PREP_PART,
    NodeReadiness: readiness.PART,
}
# Arguments that differ from every default, so that a part read with the wrong ones is found out.
ARGUMENTS: dict[str, Any] = {
    "binary": "/opt/test/nvidia-container-runtime",
    "nouveau_path": "/etc/modprobe.d/test-nouveau.conf",
    "path": "/etc/modprobe.d/test-nouveau.conf",
    "cdi_dirs": ["/opt/test/cdi"],
}


def fixture_outputs(fact: Fact) -> list[list[str]]:
    """The real outputs of ``fact`` the fixture tests hold (``tests/facts/<module>.<Fact>/*.json``)."""
    folder = TESTS / "facts" / f"{fact.__module__.rsplit('.', 1)[-1]}.{fact.__name__}"
    return [list(json.loads(path.read_text())["output"]) for path in sorted(folder.glob("*.json"))]


def snapshot_output() -> list[str]:
    """A node snapshot's output, from the real outputs of its three parts."""
    parts = {"kind": NodeKind, "prep": HostPrepState, "readiness": NodeReadiness}
    return [line for key, fact in parts.items() for line in (f"{node.PART}{key}", *fixture_outputs(fact)[-1])]


def outputs(fact: Fact) -> list[list[str]]:
    found = fixture_outputs(fact) or ([snapshot_output()] if fact is NodeSnapshot else [])
    if fact is ContainerdNodeState:  # a node with containerd 1.7 running the nvidia runtime, too
        found.append((TESTS / "samples/containerd-node-state-1.7-converged.txt").read_text().splitlines())
    return found


def part_lines(fact: Fact, output: list[str], key: str) -> list[str]:
    """The lines of ``output`` that part ``key`` of ``fact`` is read from."""
    if fact in PREFIXES:
        return split_parts(output, PREFIXES[fact], parts_of(fact))[key]
    if fact is ContainerdNodeState:
        return split_sections(output).get(key, [])
    return output  # NvidiaHostState: its parts read their sections from the whole output


def test_the_snapshot_holds_every_composite() -> None:
    names = {fact.__name__ for fact in COMPOSITES}
    assert names == {"NodeSnapshot", "NodeKind", "HostPrepState", "NodeReadiness", "NvidiaHostState",
                     "ContainerdNodeState"}  # fmt: skip
    assert all(outputs(fact) for fact in COMPOSITES), "every composite has a real output to check"


@pytest.mark.parametrize("fact", COMPOSITES, ids=lambda fact: fact.__name__)
def test_every_declared_part_is_in_the_value_as_its_fact_returns_it(fact: Fact) -> None:
    for output in outputs(fact):
        value = fact().process(output)
        missing = [key for key in parts_of(fact) if key not in value]
        assert not missing, f"{fact.__name__} declares parts its value lacks: {missing}"
        for key, part in parts_of(fact).items():
            if part.fact is not None and part.read is None:
                assert value[key] == part.fact().process(part_lines(fact, output, key)), (fact.__name__, key)


@pytest.mark.parametrize("fact", COMPOSITES, ids=lambda fact: fact.__name__)
def test_every_declared_part_is_read_with_the_arguments_it_declares(fact: Fact) -> None:
    parameters = inspect.signature(fact().command).parameters
    arguments = {name: ARGUMENTS.get(name, parameter.default) for name, parameter in parameters.items()}
    command = fact().command(**arguments)
    for key, part in parts_of(fact).items():
        held = part.arguments(arguments)
        if part.fact is None or held is None or part.from_value is not None:
            continue
        assert str(part.fact().command(**held)) in command, (fact.__name__, key, held)


def test_a_part_of_a_platforms_containerd_is_not_held_as_containerd_services() -> None:
    """Read for k3s' containerd, ``containerd`` and ``cri`` are that containerd's, not what ContainerdNodeState
    and ContainerdCriLoaded read: the declaration holds neither of them then."""
    arguments = {"binary": "/b", "cdi_dirs": None, "platform": "k3s", "unit": "k3s-agent.service"}
    parts = parts_of(NodeReadiness)
    assert readiness._platform(arguments) is not None
    value = {"containerd": {"files": {}}, "cri": {"loaded": True}}
    assert parts["containerd"].held("containerd", arguments, value) is None
    assert parts["cri"].held("cri", arguments, value) is None
    plain = {**arguments, "platform": None, "unit": None}
    assert parts["containerd"].held("containerd", plain, value) == ({"binary": "/b"}, {"files": {}})
    assert parts["cri"].held("cri", plain, {"cri": None}) is None  # no journal: not read


def test_every_fact_held_is_found_through_its_holders() -> None:
    table = holders(NodeSnapshot)
    assert [(whole.__name__, key) for whole, key, _ in table[NvidiaHostState]] == [("NodeReadiness", "host")]
    found = {(whole.__name__, key) for wholes in table.values() for whole, key, _ in wholes}
    declared = {(fact.__name__, key) for fact in COMPOSITES for key, part in parts_of(fact).items() if part.fact}
    assert found == declared


def test_a_part_missing_from_the_value_holds_nothing() -> None:
    assert Part(NodeKind).held("kind", {}, {"prep": {}}) is None
    assert Part(NodeKind).held("kind", {}, None) is None
