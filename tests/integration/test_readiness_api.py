"""The readiness deploy from Python (``add_deploy`` + ``run_ops``) on two @fake hosts answering with real
outputs: the H200 as it was read (no toolkit, no containerd) and the same node completed with the
toolkit, nvidia-ctk's spec for it, containerd 1.7 running the nvidia runtime and a device plugin."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.facts.kernel import NOUVEAU_CONF
from pyinfra_gpunode.facts.node import PART as NODE_PART
from pyinfra_gpunode.facts.node import NodeSnapshot
from pyinfra_gpunode.facts.readiness import PART, NodeReadiness
from pyinfra_gpunode.operations.readiness import reports_of
from pyinfra_gpunode.pipelines.readiness import node_readiness_reported

TESTS = Path(__file__).resolve().parents[1]
RUNTIME = "/usr/bin/nvidia-container-runtime"


def output(fact: str, name: str) -> list[str]:
    return list(json.loads((TESTS / "facts" / fact / f"{name}.json").read_text())["output"])


def parts(lines: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith(PART):
            current = found.setdefault(line.removeprefix(PART), [])
        else:
            current.append(line)
    return found


def joined(found: dict[str, list[str]]) -> list[str]:
    return [line for name, lines in found.items() for line in (PART + name, *lines)]


H200 = output("readiness.NodeReadiness", "h200_ubuntu2404_preinstalled")


def completed() -> list[str]:
    found = parts(H200)
    found["toolkit"] = output("toolkit.NvidiaContainerToolkit", "installed_1_17")
    found["cdi"] = output("cdi.CdiSpecs", "ctk_sorted_yaml_h200")
    found["containerd"] = (TESTS / "samples/containerd-node-state-1.7-converged.txt").read_text().splitlines()
    found["cri"] = ["journal", *output("containerd.ContainerdCriLoaded", "loaded_1_7")]
    found["xid"] = ["source=journal", "count=0"]
    found["containerd_journal"] = ["journal"]
    found["device_plugin"] = ["dir", "nvidia-gpu.sock"]
    return joined(found)


def fake_host(name: str, lines: list[str], report: Path) -> tuple[str, dict[str, Any]]:
    responses: dict[Any, Any] = {
        re.compile(r">&2 && exit 1$"): {"success": False},  # operations' fail(): a failing command
        NodeSnapshot().command(RUNTIME, NOUVEAU_CONF): [f"{NODE_PART}readiness", *lines],  # read as one
        NodeReadiness().command(RUNTIME): lines,
    }
    data = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0, "gpunode_readiness_json": str(report)}
    return f"@fake/{name}", data


def test_python_users_get_every_nodes_chain_and_not_ready_nodes_fail(tmp_path: Path) -> None:
    report = tmp_path / "readiness.json"
    hosts = [fake_host("gpu1", completed(), report), fake_host("gpu2", H200, report)]
    state = State(inventory=Inventory((hosts, {})), config=Config())
    connect_all(state)
    try:
        add_deploy(state, node_readiness_reported)
        run_ops(state)
    finally:
        disconnect_all(state)

    assert [host.name for host in state.failed_hosts] == ["@fake/gpu2"]
    reports = reports_of(state)
    assert reports["@fake/gpu1"].ready
    assert reports["@fake/gpu2"].first_broken is not None and reports["@fake/gpu2"].first_broken.id == "toolkit"
    document = json.loads(report.read_text())
    assert document["summary"] == {
        "ready": 1, "total": 2, "not_ready_by_first_broken_link": {"toolkit": ["@fake/gpu2"]},
    }  # fmt: skip
    commands = state.inventory.get_host("@fake/gpu1").connector.executed_commands  # type: ignore[attr-defined]
    assert len(commands) == 1, commands  # the whole chain in one remote command, nothing else


def test_a_hostile_cdi_spec_breaks_only_its_nodes_cdi_link(tmp_path: Path) -> None:
    """An alias bomb on one node and 100000 nested lists on another: each node's ``cdi`` link is broken
    naming the file and the limit, and the healthy node is reported ready as usual."""
    bomb = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
    )
    report = tmp_path / "readiness.json"
    hosts = [fake_host("gpu1", completed(), report)]
    for name, text in (("gpu2", bomb), ("gpu3", "[" * 100_000)):
        found = parts(completed())
        found["cdi"] = ["@@gpunode-cdi-spec 1764544583 /etc/cdi/nvidia.yaml", *text.splitlines(), ""]
        hosts.append(fake_host(name, joined(found), report))
    state = State(inventory=Inventory((hosts, {})), config=Config())
    connect_all(state)
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: pytest.fail("still reading after 60 s"))
    signal.alarm(60)
    try:
        add_deploy(state, node_readiness_reported)
        run_ops(state)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        disconnect_all(state)

    assert sorted(host.name for host in state.failed_hosts) == ["@fake/gpu2", "@fake/gpu3"]
    nodes = {node["node"]: node for node in json.loads(report.read_text())["nodes"]}
    assert nodes["@fake/gpu1"]["ready"]
    for name, limit in (("@fake/gpu2", "YAML nodes (aliases expanded)"), ("@fake/gpu3", "nested deeper than 64")):
        assert nodes[name]["first_broken"] == "cdi"
        assert nodes[name]["cause"].startswith("/etc/cdi/nvidia.yaml is refused unparsed: "), nodes[name]
        assert limit in nodes[name]["cause"]
