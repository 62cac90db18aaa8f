"""deploys/gpu_node.py on three systemd hosts (containerd 1.7, 1.7, 2.1): order, rollback, halt, dry run, re-runs."""

from __future__ import annotations

import itertools
import os
import re
import runpy
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.pipeline import gpu_node_prepared
from tests.fleet.fleet import Fleet
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS, registry, toolkit_dropin

REPO = Path(__file__).resolve().parents[2]
NODES = ("node1", "node2", "node3")
OUR_DROPIN = "/etc/containerd/gpunode/nvidia-runtime.toml"
pytestmark = pytest.mark.fleet

# node2's containerd refuses to start while our drop-in exists: a restart failure only our change
# causes. A start limit of one start a minute makes the rollback's restart hit ``start-limit-hit``
# unless the rollout clears it.
INJECT_FAILURE = (
    "mkdir -p /etc/systemd/system/containerd.service.d && printf '%s\\n' "
    "'[Unit]' 'StartLimitIntervalSec=60' 'StartLimitBurst=1' '[Service]' "
    f"'ExecStartPre=/bin/sh -c \"test ! -e {OUR_DROPIN}\"' "
    "> /etc/systemd/system/containerd.service.d/test-failure.conf && systemctl daemon-reload"
)


def deploy(fleet: Fleet, *args: str, inventory: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The pyinfra CLI; stdout carries its log (stderr merged)."""
    pyinfra = Path(sys.executable).with_name("pyinfra")
    return subprocess.run(
        [str(pyinfra), *args, str(inventory or fleet.inventory_path), "deploys/gpu_node.py"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )


def sh(fleet: Fleet, node: str, command: str) -> str:
    result = fleet.run(node, command)
    assert result.returncode == 0, f"{node}: {command}: {result.stderr}"
    return result.stdout


def main_pid(fleet: Fleet, node: str) -> str:
    return sh(fleet, node, "systemctl show -p MainPID --value containerd").strip()


def digest(fleet: Fleet, node: str, directory: str) -> str:
    """One hash over every file's path and content under ``directory``."""
    return sh(fleet, node, f"find {directory} -xdev -type f -print0 | sort -z | xargs -0 -r sha256sum | sha256sum")


def running_runtimes(fleet: Fleet, node: str) -> str:
    """The running daemon's CRI start line (1.x prints runtimes and registry ConfigPath there)."""
    return sh(
        fleet, node,
        "id=$(systemctl show -p InvocationID --value containerd); "
        "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=$id | grep -E 'Start cri plugin|starting cri plugin'",
    )


def unit_time(fleet: Fleet, node: str, prop: str) -> datetime:
    value = sh(fleet, node, f"systemctl show -p {prop} --value --timestamp=us+utc containerd").strip()
    return datetime.strptime(value, "%a %Y-%m-%d %H:%M:%S.%f UTC").replace(tzinfo=UTC)


def write(fleet: Fleet, node: str, path: str, text: str) -> None:
    result = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), node, f"mkdir -p $(dirname {path}) && cat > {path}"],
        input=text, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_clean_and_field_incident_nodes_converge_in_inventory_order(fleet: Fleet) -> None:
    fleet.reset(NODES)
    # node2 is the field incident: the toolkit's 99-nvidia.toml, then a registry drop-in that
    # (on 1.7) replaces the whole CRI section, so the running daemon has no nvidia runtime.
    write(fleet, "node2", CONFIG, "version = 2\n" + IMPORTS)
    write(fleet, "node2", f"{CONFD}/99-nvidia.toml", toolkit_dropin())
    write(fleet, "node2", f"{CONFD}/99-registry.toml", registry("/etc/containerd/certs.d"))
    sh(fleet, "node2", "systemctl restart containerd")
    assert "nvidia" not in running_runtimes(fleet, "node2")

    first = deploy(fleet, "-y")
    assert first.returncode == 0, first.stdout
    assert "Summary (rollout order)" in first.stdout

    for node in NODES:
        dump = sh(fleet, node, "containerd config dump")
        assert "nvidia" in dump and "config_path" in dump, node
        assert "nvidia" in running_runtimes(fleet, node), node
    assert "ConfigPath:/etc/containerd/certs.d" in running_runtimes(fleet, "node2")

    # Strictly one after another, in inventory order: each restart begins after the previous
    # node's daemon is up again (and verified, which happens before the next turn).
    for previous, following in itertools.pairwise(NODES):
        assert unit_time(fleet, following, "ActiveExitTimestamp") > unit_time(fleet, previous, "ActiveEnterTimestamp")

    pids = {node: main_pid(fleet, node) for node in NODES}
    etc = {node: digest(fleet, node, "/etc") for node in NODES}
    second = deploy(fleet, "-y")
    assert second.returncode == 0, second.stdout
    assert {node: main_pid(fleet, node) for node in NODES} == pids, "the second run restarted containerd"
    assert {node: digest(fleet, node, "/etc") for node in NODES} == etc, "the second run changed files"


def test_restart_failure_on_node2_rolls_back_and_halts(fleet: Fleet) -> None:
    fleet.reset(NODES)
    sh(fleet, "node2", INJECT_FAILURE)
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in NODES}

    result = deploy(fleet, "-y")
    output = result.stdout
    assert result.returncode != 0, output
    assert "[node2]" in output and "containerd failed after the restart" in output
    assert "the previous config was restored and containerd runs it again" in output
    assert "[node2] containerd rollout failed" in output
    assert "[node1] containerd rollout failed" not in output and "[node3] containerd rollout failed" not in output
    assert "halted: not touched after the failure on node2" in output

    # node1: done
    assert "nvidia" in running_runtimes(fleet, "node1")
    sh(fleet, "node1", f"test -f {OUR_DROPIN}")
    # node2: rolled back, active on its old files, the failed files kept aside
    assert sh(fleet, "node2", "systemctl is-active containerd").strip() == "active"
    assert digest(fleet, "node2", "/etc/containerd") == before["node2"][1]
    assert "nvidia" not in running_runtimes(fleet, "node2")
    sh(fleet, "node2", f"test -f /var/lib/pyinfra-gpunode/failed/containerd-*{OUR_DROPIN.removeprefix('/etc')}")
    # node3: untouched
    assert (main_pid(fleet, "node3"), digest(fleet, "node3", "/etc/containerd")) == before["node3"]


def test_dry_run_changes_nothing_and_prints_the_plan(fleet: Fleet) -> None:
    fleet.reset(NODES)
    write(fleet, "node3", f"{CONFD}/50-broken.toml", "this is = = not TOML\n")  # the gate must block node3
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc")) for node in NODES}
    result = deploy(fleet, "--dry")
    assert result.returncode == 0, result.stdout
    assert {node: (main_pid(fleet, node), digest(fleet, node, "/etc")) for node in NODES} == before
    for node in ("node1", "node2"):
        assert f"[{node}] plan: write /etc/containerd/config.toml, {OUR_DROPIN}" in result.stdout
    assert f"+++ {OUR_DROPIN} (planned)" in result.stdout
    assert re.search(r"\[node3\] plan: containerd config not changed: .*50-broken\.toml", result.stdout)


def _api_deploy(fleet: Fleet) -> State:
    """The same deploy from Python: add_deploy + run_ops on a State of our own."""
    inventory = Inventory((runpy.run_path(str(fleet.inventory_path))["hosts"], {}))
    state = State(inventory=inventory, config=Config())
    connect_all(state)
    try:
        add_deploy(state, gpu_node_prepared)
        run_ops(state)
    except PyinfraError:
        pass
    finally:
        disconnect_all(state)
    return state


def test_killed_run_converges_on_the_next_run(fleet: Fleet) -> None:
    fleet.reset(NODES)
    pyinfra = Path(sys.executable).with_name("pyinfra")
    run = subprocess.Popen(
        [str(pyinfra), "-y", str(fleet.inventory_path), "deploys/gpu_node.py"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )
    assert run.stdout is not None
    seen = []
    for line in run.stdout:  # kill it right after node2's files are written, before its restart
        seen.append(line)
        if "[node2]" in line and "containerd restart pending" in line:
            os.killpg(run.pid, signal.SIGKILL)
            break
    run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL, "".join(seen)

    state = _api_deploy(fleet)
    assert not state.failed_hosts, [host.name for host in state.failed_hosts]
    for node in NODES:
        assert "nvidia" in running_runtimes(fleet, node), node
        assert sh(fleet, node, "find /etc -name '*.gpunode-new' -o -name '.gpunode-restore.*'") == "", node
    pids = {node: main_pid(fleet, node) for node in NODES}
    assert not _api_deploy(fleet).failed_hosts
    assert {node: main_pid(fleet, node) for node in NODES} == pids


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpunode_rollout_order": ["node3", "node9"]}, "names hosts not in the inventory: node9"),
        ({"gpunode_restart_timeout": "60"}, "'gpunode_restart_timeout' must be int"),
        ({"gpunode_rollout": "rolling"}, "unknown host-data key 'gpunode_rollout'"),
        ({"node1": {"gpunode_rollout_order": ["node2"]}}, "'gpunode_rollout_order' differs between hosts"),
    ],
)
def test_bad_host_data_is_refused_before_any_node_is_touched(
    fleet: Fleet, tmp_path: Path, data: dict[str, Any], message: str
) -> None:
    """Group data for all hosts, or (keyed by a host name) that host's own data."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "import runpy\n"
        f"hosts = runpy.run_path({str(fleet.inventory_path)!r})['hosts']\n"
        f"data = {data!r}\n"
        "for name, host_data in hosts:\n"
        "    host_data.update(data.get(name, {}))\n"
        "hosts = (hosts, {key: value for key, value in data.items() if key.startswith('gpunode_')})\n"
    )
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc")) for node in NODES}
    result = deploy(fleet, "-y", inventory=inventory)
    assert result.returncode != 0
    assert message in result.stdout
    assert {node: (main_pid(fleet, node), digest(fleet, node, "/etc")) for node in NODES} == before
