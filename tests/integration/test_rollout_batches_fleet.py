"""Rollouts at fleet scale on six systemd hosts (trixie, containerd 1.7): a canary alone and first, then
batches whose turns (hooks, restarts) run side by side and never across batches, a failure in a batch
rolled back while the rest of its batch completes and later batches stay untouched, a failure budget,
and a run killed during a batch that the next run resumes, the cut-off turns first.

Restarts are timed from the units' own timestamps (the hosts share this machine's clock); every
host's containerd takes two seconds to start (``ExecStartPre=/bin/sleep 2``) so that turns running
side by side show as overlapping restarts. The hooks are real programs that record their argv, the
``GPUNODE_`` environment, and when they started and ended."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory
from tests.integration.summary import summary_rows
from tests.integration.test_gpu_node_fleet import (
    INJECT_FAILURE,
    OUR_DROPIN,
    digest,
    main_pid,
    running_runtimes,
    sh,
    unit_time,
)

REPO = Path(__file__).resolve().parents[2]
NODES = ("bt1", "bt2", "bt3", "bt4", "bt5", "bt6")
MARK = "/var/lib/pyinfra-gpunode/turn.json"
pytestmark = pytest.mark.fleet

SLOW_START = (
    "mkdir -p /etc/systemd/system/containerd.service.d && printf '%s\\n' '[Service]' 'ExecStartPre=/bin/sleep 2' "
    "> /etc/systemd/system/containerd.service.d/slow-start.conf && systemctl daemon-reload"
)

HOOK = """#!{python}
import json, os, sys, time
which, node = sys.argv[1], sys.argv[2]
env = {{key: value for key, value in os.environ.items() if key.startswith("GPUNODE_")}}
started = time.time()
print(f"{{which}}-hook for {{node}} here", flush=True)
time.sleep(float(dict(item.split("=") for item in os.environ.get("HOOK_SLEEP", "").split(",") if item)
           .get(f"{{which}}:{{node}}", os.environ.get("HOOK_SLEEP_ALL", "0"))))
with open({log!r}, "a") as log:
    log.write(json.dumps({{"start": started, "end": time.time(), "argv": sys.argv[1:], "env": env}}) + "\\n")
sys.exit(1 if f"{{which}}:{{node}}" in os.environ.get("HOOK_FAILS", "").split(",") else 0)
"""


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    # Names of their own: fleets share network namespaces by host name.
    with fleet_factory.lent([HostSpec(name, "trixie") for name in NODES], "batches") as booted:
        yield booted


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    script = tmp_path / "hook"
    script.write_text(HOOK.format(python=sys.executable, log=str(tmp_path / "hooks.jsonl")))
    script.chmod(0o755)
    return script


def calls(hook: Path) -> list[dict[str, Any]]:
    log = hook.with_name("hooks.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def by_turn(hook: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(call["argv"][0], call["argv"][1]): call for call in calls(hook)}


def inventory(fleet: Fleet, tmp_path: Path, hook: Path, **data: Any) -> Path:
    hooks = {
        "gpunode_rollout_before": [str(hook), "before", "{node}"],
        "gpunode_rollout_after": [str(hook), "after", "{node}"],
        "gpunode_hook_timeout": 120,
    }
    path = tmp_path / "inventory.py"
    path.write_text(
        "import runpy\n"
        f"data = { ({**hooks, **data})!r}\n"
        f"hosts = [(name, {{**host_data, **data}}) for name, host_data in runpy.run_path({str(fleet.inventory_path)!r})"
        "['hosts']]\n"
    )
    return path


def pyinfra(path: Path, *args: str) -> list[str]:
    return [str(cli.PYINFRA), *args, str(path), "deploys/gpu_node.py"]


def deploy(path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, path, "deploys/gpu_node.py", env=env)


def fresh(fleet: Fleet, nodes: Iterable[str] = NODES) -> None:
    """Fresh hosts whose containerd takes two seconds to start."""
    fleet.reset(nodes)
    for node in nodes:
        sh(fleet, node, SLOW_START)


def restarts(fleet: Fleet, nodes: Iterable[str]) -> dict[str, tuple[datetime, datetime]]:
    """Each node's last containerd restart: when the old daemon stopped and the new one was up."""
    return {node: (unit_time(fleet, node, "ActiveExitTimestamp"), unit_time(fleet, node, "ActiveEnterTimestamp"))
            for node in nodes}  # fmt: skip


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def state_of(fleet: Fleet, nodes: Iterable[str]) -> dict[str, tuple[str, str]]:
    return {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in nodes}


def test_a_canary_goes_alone_then_batches_run_side_by_side_and_never_across(
    fleet: Fleet, tmp_path: Path, hook: Path
) -> None:
    fresh(fleet)
    path = inventory(fleet, tmp_path, hook, gpunode_rollout_canary=1, gpunode_rollout_batch=2)
    before = state_of(fleet, NODES)

    dry = deploy(path, "--dry")
    assert dry.returncode == 0, dry.stdout
    plan = dry.stdout[dry.stdout.index("--> Rollout plan") :]
    expected = ["canary 1/1: bt1", "batch 1/3: bt2, bt3", "batch 2/3: bt4, bt5", "batch 3/3: bt6"]
    assert [line for line in plan.splitlines()[1:5]] == expected, plan
    assert calls(hook) == [] and state_of(fleet, NODES) == before
    assert "\n--- /etc/containerd/config.toml (node)" in dry.stdout and "\\n---" not in dry.stdout  # the diff

    run = deploy(path, "-y", HOOK_SLEEP_ALL="1")
    assert run.returncode == 0, run.stdout
    assert run.stdout.count("--> Rollout plan") == 1
    made = by_turn(hook)
    groups = [["bt1"], ["bt2", "bt3"], ["bt4", "bt5"], ["bt6"]]
    labels = ["canary 1/1", "batch 1/3", "batch 2/3", "batch 3/3"]
    turn = 0
    for group, label in zip(groups, labels, strict=True):
        for node in group:
            turn += 1
            for which in ("before", "after"):
                env = made[which, node]["env"]
                assert env["GPUNODE_NODE"] == node and env["GPUNODE_HOOK"] == which
                assert env["GPUNODE_BATCH"] == label and env["GPUNODE_TURN"].endswith("/6"), env
            assert f"[{node}] before-hook | before-hook for {node} here" in run.stdout
            assert f", {label}: {node} done in " in run.stdout
    # The hooks of a batch run at the same time, each for its own node.
    for first, second in (("bt2", "bt3"), ("bt4", "bt5")):
        a, b = made["before", first], made["before", second]
        assert a["start"] < b["end"] and b["start"] < a["end"], (a, b)
    # Restarts overlap within a batch, and a group's restarts all end before the next group's begin.
    times = restarts(fleet, NODES)
    for group in groups:
        assert max(times[node][0] for node in group) < min(times[node][1] for node in group), group
    for earlier, later in itertools.pairwise(groups):
        assert max(times[node][1] for node in earlier) < min(times[node][0] for node in later), (earlier, later)
        assert max(at(made["after", node]["end"]) for node in earlier) < min(
            at(made["before", node]["start"]) for node in later
        )
    for node in NODES:
        assert "nvidia" in running_runtimes(fleet, node), node
        assert sh(fleet, node, f"test -e {MARK} && echo marked || echo clean").strip() == "clean"
    assert "rollout: 6 turns in 4 groups" in run.stdout


def test_nodes_out_of_service_shrink_the_batches_they_are_not_in(fleet: Fleet, tmp_path: Path, hook: Path) -> None:
    fresh(fleet)
    sh(fleet, "bt6", "systemctl stop containerd")  # down until its turn, in the last batch
    with socket.socket() as probe:  # a port nothing listens on: a node unreachable before the rollout
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    path = inventory(fleet, tmp_path, hook, gpunode_rollout_canary=1, gpunode_rollout_batch=3)
    path.write_text(
        path.read_text()
        + f"hosts.append(('bt-gone', {{**hosts[0][1], 'ssh_port': {closed}, 'ssh_connect_retries': 0}}))\n"
    )

    # Enter: go on without the node that failed to connect (-y would skip the plan)
    dry = subprocess.run(
        pyinfra(path, "--dry"),
        cwd=REPO,
        input="\n",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert "--> Rollout plan" in dry.stdout, dry.stdout
    plan = dry.stdout[dry.stdout.index("--> Rollout plan") :].splitlines()[1:7]
    assert plan == [
        "out of service, counted against each batch they are not in (of 3): bt-gone (failed or unreachable before "
        "the rollout), bt6 (containerd inactive until its turn)",
        "canary 1/1: bt1",
        "batch 1/4: bt2",  # bt-gone and bt6 down: one turn beside them
        "batch 2/4: bt3",
        "batch 3/4: bt4",
        "batch 4/4: bt5, bt6",  # bt6 in it: only bt-gone counts against it
    ], dry.stdout
    sh(fleet, "bt6", "systemctl start containerd")


def test_a_failed_turn_rolls_back_its_batch_completes_and_the_budget_decides_the_rest(
    fleet: Fleet, tmp_path: Path, hook: Path
) -> None:
    fresh(fleet)
    sh(fleet, "bt4", INJECT_FAILURE)  # bt4's containerd will not start with our drop-in
    path = inventory(fleet, tmp_path, hook, gpunode_rollout_batch=2)
    before = state_of(fleet, NODES)

    run = deploy(path, "-y")
    assert run.returncode != 0, run.stdout
    rows = summary_rows(run.stdout)
    assert "[bt4] containerd rollout failed" in run.stdout and "containerd failed after the restart" in run.stdout
    for node in ("bt1", "bt2", "bt3"):  # the first batch, and bt4's partner in the second
        assert "done:" in rows[node] and "nvidia" in running_runtimes(fleet, node), (node, rows[node])
    assert sh(fleet, "bt4", "systemctl is-active containerd").strip() == "active"
    assert digest(fleet, "bt4", "/etc/containerd") == before["bt4"][1]  # rolled back
    for node in ("bt5", "bt6"):  # the third batch: untouched
        assert "halted: not touched after the failure on bt4" in rows[node], rows[node]
        assert state_of(fleet, [node]) == {node: before[node]}
    assert "rollout halted: failed: bt4; not touched: bt5, bt6" in run.stdout
    assert "run the same command again to continue" in run.stdout
    assert {call["argv"][1] for call in calls(hook) if call["argv"][0] == "before"} == {"bt1", "bt2", "bt3", "bt4"}

    # A budget of one failure: the rollout goes on past the first and halts at the second. bt4, whose
    # turn failed (it stays cordoned by its before-hook), takes its turn again first, alone.
    sh(fleet, "bt4", "rm /etc/systemd/system/containerd.service.d/test-failure.conf && systemctl daemon-reload")
    for node in NODES:  # every node has a turn to take: a restart (bt1-bt3) or its files (bt4-bt6)
        sh(fleet, node, "touch /etc/containerd/config.toml")
    hook.with_name("hooks.jsonl").unlink()
    budget = inventory(fleet, tmp_path, hook, gpunode_rollout_batch=2, gpunode_rollout_max_failed=1)
    before = state_of(fleet, NODES)
    run = deploy(budget, "-y", HOOK_FAILS="before:bt2,before:bt5")
    assert run.returncode != 0, run.stdout
    plan = run.stdout[run.stdout.index("--> Rollout plan") :].splitlines()[1:5]
    assert plan == ["resumed 1/1: bt4", "batch 1/3: bt1, bt2", "batch 2/3: bt3, bt5", "batch 3/3: bt6"], plan
    rows = summary_rows(run.stdout)
    for node in ("bt4", "bt1", "bt3"):
        assert "done:" in rows[node], rows[node]
    assert "nvidia" in running_runtimes(fleet, "bt4")
    for node in ("bt2", "bt5"):
        assert "failed: before-hook" in rows[node] and state_of(fleet, [node]) == {node: before[node]}
    assert "halted: not touched after 2 failed turns (bt2, bt5; gpunode_rollout_max_failed is 1)" in rows["bt6"]
    assert state_of(fleet, ["bt6"]) == {"bt6": before["bt6"]}
    assert "rollout halted: failed: bt2, bt5; not touched: bt6" in run.stdout


def test_a_run_killed_during_a_batch_is_resumed_cut_off_turns_first(fleet: Fleet, tmp_path: Path, hook: Path) -> None:
    fresh(fleet)
    path = inventory(fleet, tmp_path, hook, gpunode_rollout_batch=2)
    run = subprocess.Popen(
        pyinfra(path, "-y"), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HOOK_SLEEP": "before:bt3=120,before:bt4=120"},
        start_new_session=True,
    )  # fmt: skip
    assert run.stdout is not None
    seen, waiting = [], {"[bt3] before-hook:", "[bt4] before-hook:"}
    for line in run.stdout:  # killed while the second batch's before-hooks run (the nodes "drained")
        seen.append(line)
        waiting = {text for text in waiting if text not in line}
        if not waiting:
            os.killpg(run.pid, signal.SIGKILL)
            break
    run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL, "".join(seen)
    for node in ("bt3", "bt4"):
        assert '"started"' in sh(fleet, node, f"cat {MARK}"), node
    untouched = state_of(fleet, ("bt5", "bt6"))

    hook.with_name("hooks.jsonl").unlink()
    again = deploy(path, "-y")
    assert again.returncode == 0, again.stdout
    plan = again.stdout[again.stdout.index("--> Rollout plan") :].splitlines()[1:4]
    assert plan == ["resumed 1/2: bt3", "resumed 2/2: bt4", "batch 1/1: bt5, bt6"], plan
    made = calls(hook)
    assert [call["argv"][:2] for call in made[:4]] == [
        ["before", "bt3"], ["after", "bt3"], ["before", "bt4"], ["after", "bt4"]
    ]  # fmt: skip
    assert "resume the turn an earlier run began at" in made[0]["env"]["GPUNODE_CHANGES"]
    rows = summary_rows(again.stdout)
    for node in NODES:
        assert "nvidia" in running_runtimes(fleet, node), node
        assert sh(fleet, node, f"test -e {MARK} && echo marked || echo clean").strip() == "clean", node
    assert "unchanged" in rows["bt1"] and "unchanged" in rows["bt2"]
    assert "containerd restarted and verified" in rows["bt3"], rows["bt3"]
    assert state_of(fleet, ("bt5", "bt6")) != untouched
    sh(fleet, "bt3", f"test -f {OUR_DROPIN}")
