"""deploys/gpu_node.py on three systemd hosts (containerd 1.7, 1.7, 2.3): order, rollback, halt, dry run, re-runs,
per-node host data, backups tied to the turn, dead daemons, foreign units, log levels, the node lock."""

from __future__ import annotations

import itertools
import os
import re
import runpy
import signal
import subprocess
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.pipelines.gpu_node import gpu_node_prepared
from tests import cli
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


def deploy(
    fleet: Fleet, *args: str, inventory: Path | None = None, deploy_file: str = "deploys/gpu_node.py"
) -> subprocess.CompletedProcess[str]:
    """The pyinfra CLI; stdout carries its log (stderr merged)."""
    return cli.pyinfra(*args, inventory or fleet.inventory_path, deploy_file)


def inventory_of(fleet: Fleet, tmp_path: Path, data: dict[str, dict[str, Any]]) -> Path:
    """An inventory of the fleet's hosts named in ``data``, each with its own extra host data."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "import runpy\n"
        f"data = {data!r}\n"
        f"hosts = [(name, {{**host_data, **data[name]}}) for name, host_data in "
        f"runpy.run_path({str(fleet.inventory_path)!r})['hosts'] if name in data]\n"
    )
    return inventory


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
        fleet,
        node,
        "id=$(systemctl show -p InvocationID --value containerd); "
        "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=$id | grep -E 'Start cri plugin|starting cri plugin'",
    )


def unit_time(fleet: Fleet, node: str, prop: str) -> datetime:
    value = sh(fleet, node, f"systemctl show -p {prop} --value --timestamp=us+utc containerd").strip()
    return datetime.strptime(value, "%a %Y-%m-%d %H:%M:%S.%f UTC").replace(tzinfo=UTC)


def write(fleet: Fleet, node: str, path: str, text: str) -> None:
    result = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), node, f"mkdir -p $(dirname {path}) && cat > {path}"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
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
    locks = {node: sh(fleet, node, "cat /run/pyinfra-gpunode/node.lock") for node in NODES}
    second = deploy(fleet, "-y", "--debug")
    assert second.returncode == 0, second.stdout
    assert {node: main_pid(fleet, node) for node in NODES} == pids, "the second run restarted containerd"
    assert {node: digest(fleet, node, "/etc") for node in NODES} == etc, "the second run changed files"
    # Nothing to do: one remote command per node (its snapshot, read once for every step), no lock taken.
    ran = re.findall(r"Running command on (node\d): ", second.stdout)
    assert {node: ran.count(node) for node in NODES} == dict.fromkeys(NODES, 1), ran
    assert {node: sh(fleet, node, "cat /run/pyinfra-gpunode/node.lock") for node in NODES} == locks
    # The host steps: an operation each where they had changes to make; one operation on converged nodes.
    prep = "kernel: held; unattended-upgrades and needrestart: configured; nouveau: blacklisted"
    alone = re.compile(r"^--> Starting operation: .*\| unattended-upgrades and needrestart: configured\s*$", re.M)
    assert alone.search(first.stdout) and prep not in first.stdout, first.stdout
    assert prep in second.stdout and not alone.search(second.stdout), second.stdout


def test_restart_failure_on_node2_rolls_back_and_halts(fleet: Fleet) -> None:
    fleet.reset(NODES)
    sh(fleet, "node2", INJECT_FAILURE)
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in NODES}

    result = deploy(fleet, "-y")
    output = result.stdout
    assert result.returncode != 0, output
    assert "[node2]" in output and "containerd failed after the restart" in output
    assert "the config this run wrote was replaced by the backup taken before it and containerd runs it again" in output
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
    sh(fleet, "node2", f"test -f /var/lib/pyinfra-gpunode/failed/containerd-*{OUR_DROPIN}")
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
        # The drop-in first: config.toml names it, and containerd does not start on a missing import.
        assert f"[{node}] plan: write {OUR_DROPIN}, /etc/containerd/config.toml" in result.stdout
    assert f"+++ {OUR_DROPIN} (planned)" in result.stdout
    assert re.search(r"\[node3\] plan: containerd config not changed: .*50-broken\.toml", result.stdout)


def _api_deploy(fleet: Fleet, inventory_path: Path | None = None) -> State:
    """The same deploy from Python: add_deploy + run_ops on a State of our own."""
    inventory = Inventory((runpy.run_path(str(inventory_path or fleet.inventory_path))["hosts"], {}))
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
    pyinfra = cli.PYINFRA
    run = subprocess.Popen(
        [str(pyinfra), "-y", str(fleet.inventory_path), "deploys/gpu_node.py"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
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


BACKUPS = "/var/lib/pyinfra-gpunode/backup"
FAILED = "/var/lib/pyinfra-gpunode/failed"


def dumped_nvidia(fleet: Fleet, node: str) -> dict[str, Any]:
    """The nvidia runtime and the CDI dirs in the node's ``containerd config dump`` (files on disk)."""
    dump = tomllib.loads(sh(fleet, node, "containerd config dump"))
    plugins = dump["plugins"]
    cri = plugins.get("io.containerd.cri.v1.runtime") or plugins["io.containerd.grpc.v1.cri"]
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    return {"binary": nvidia["options"]["BinaryName"], "cdi_spec_dirs": cri.get("cdi_spec_dirs")}


@pytest.mark.parametrize("way", ["cli", "api"])
def test_each_node_runs_with_its_own_host_data(fleet: Fleet, tmp_path: Path, way: str) -> None:
    """Each node is written and verified with its own settings, whichever host conducts; a
    ``gpunode_containerd_restart: none`` node gets its files and keeps its daemon."""
    fleet.reset(NODES)
    data: dict[str, dict[str, Any]] = {
        node: {
            "gpunode_nvidia_runtime_binary": f"/opt/{node}/nvidia-container-runtime",
            "gpunode_cdi_spec_dirs": [f"/etc/cdi-{node}"],
        }
        for node in NODES
    }
    data["node3"]["gpunode_containerd_restart"] = "none"
    inventory = inventory_of(fleet, tmp_path, data)
    pid3 = main_pid(fleet, "node3")

    if way == "cli":
        result = deploy(fleet, "-y", inventory=inventory)
        assert result.returncode == 0, result.stdout
        assert "files only (gpunode_containerd_restart: none)" in result.stdout
    else:
        state = _api_deploy(fleet, inventory)
        assert not state.failed_hosts, [host.name for host in state.failed_hosts]

    for node in NODES:
        assert dumped_nvidia(fleet, node) == {
            "binary": f"/opt/{node}/nvidia-container-runtime",
            "cdi_spec_dirs": [f"/etc/cdi-{node}"],
        }, node
    for node in ("node1", "node2"):
        assert f"/opt/{node}/nvidia-container-runtime" in running_runtimes(fleet, node), node
    assert main_pid(fleet, "node3") == pid3, "node3 (gpunode_containerd_restart: none) was restarted"
    assert "nvidia" not in running_runtimes(fleet, "node3")


def test_warn_log_level_verifies_through_ctr_without_a_rollback(fleet: Fleet, tmp_path: Path) -> None:
    """With ``[debug] level = "warn"`` containerd logs no CRI start line: the restart is verified
    through ``ctr plugins ls`` instead of timing out and being rolled back."""
    fleet.reset(["node1"])
    write(fleet, "node1", CONFIG, sh(fleet, "node1", f"cat {CONFIG}") + '\n[debug]\n  level = "warn"\n')
    sh(fleet, "node1", "systemctl restart containerd")
    inventory = inventory_of(fleet, tmp_path, {"node1": {"gpunode_restart_timeout": 20}})

    result = deploy(fleet, "-y", inventory=inventory)
    assert result.returncode == 0, result.stdout
    verified = r"\[node1\] (nested )?containerd restarted and verified by ctr plugins ls"
    assert re.search(verified, result.stdout), result.stdout
    assert "containerd rollout done" in result.stdout
    assert dumped_nvidia(fleet, "node1")["binary"] == "/usr/bin/nvidia-container-runtime"
    assert sh(fleet, "node1", f"ls {FAILED} 2>/dev/null || true") == "", "node1 was rolled back"
    assert re.search(r"grpc\.v1\s+cri\s+\S+\s+ok", sh(fleet, "node1", "ctr plugins ls"))


def test_a_dead_daemon_is_restarted_and_a_foreign_unit_refused(fleet: Fleet) -> None:
    """Converged files do not pass over a stopped containerd; a containerd run by a unit of
    another name is refused, naming that unit, and nothing is written there."""
    fleet.reset(NODES)
    assert deploy(fleet, "-y").returncode == 0
    sh(fleet, "node1", "systemctl stop containerd")
    sh(
        fleet,
        "node3",
        "systemctl disable --now containerd && "
        "cp /usr/lib/systemd/system/containerd.service /etc/systemd/system/k8s-containerd.service && "
        "rm /usr/lib/systemd/system/containerd.service && systemctl daemon-reload && "
        "systemctl start k8s-containerd && rm " + OUR_DROPIN,
    )
    before3 = digest(fleet, "node3", "/etc/containerd")

    result = deploy(fleet, "-y")
    assert result.returncode != 0, result.stdout
    restarted = r"\[node1\] (nested )?restarting containerd: containerd is inactive"
    assert re.search(restarted, result.stdout), result.stdout
    assert sh(fleet, "node1", "systemctl is-active containerd").strip() == "active"
    assert "nvidia" in running_runtimes(fleet, "node1")
    assert re.search(
        r"\[node3\] containerd rollout failed: containerd.service is not-found "
        r"\(containerd runs as pid \d+ in k8s-containerd.service\)",
        result.stdout,
    ), result.stdout
    assert digest(fleet, "node3", "/etc/containerd") == before3


def test_a_restart_pending_from_before_restores_nothing(fleet: Fleet, tmp_path: Path) -> None:
    """A restart this run did not cause (a config touched since) that fails restores no backup
    of an earlier run and says so."""
    fleet.reset(["node1"])
    inventory = inventory_of(fleet, tmp_path, {"node1": {}})
    assert deploy(fleet, "-y", inventory=inventory).returncode == 0  # a backup from this earlier run
    sh(
        fleet,
        "node1",
        "mkdir -p /etc/systemd/system/containerd.service.d && printf '%s\\n' '[Service]' "
        "'ExecStartPre=/bin/false' > /etc/systemd/system/containerd.service.d/test-failure.conf && "
        f"systemctl daemon-reload && touch {CONFIG}",
    )
    before = digest(fleet, "node1", "/etc/containerd")

    result = deploy(fleet, "-y", inventory=inventory)
    assert result.returncode != 0, result.stdout
    assert "nothing was restored: this run wrote no containerd config on this node" in result.stdout, result.stdout
    assert "its config is newer than the daemon" in result.stdout
    assert digest(fleet, "node1", "/etc/containerd") == before
    assert sh(fleet, "node1", f"ls {FAILED} 2>/dev/null || true") == ""


def test_a_main_config_outside_etc_containerd_is_restored_and_backups_are_private(fleet: Fleet, tmp_path: Path) -> None:
    """``--config /etc/k8s/containerd.toml``: the turn's backup holds it and the rollback puts
    it back; backups and failed copies are readable by root only."""
    fleet.reset(["node1"])
    main = "/etc/k8s/containerd.toml"
    sh(
        fleet,
        "node1",
        f"mkdir -p /etc/k8s && mv {CONFIG} {main} && {INJECT_FAILURE} && printf '%s\\n' "
        f"'[Service]' 'ExecStart=' 'ExecStart=/usr/bin/containerd --config {main}' "
        "> /etc/systemd/system/containerd.service.d/test-config.conf && systemctl daemon-reload && "
        "systemctl restart containerd",
    )
    before = sh(fleet, "node1", f"sha256sum {main}")
    inventory = inventory_of(fleet, tmp_path, {"node1": {}})

    result = deploy(fleet, "-y", inventory=inventory)
    assert result.returncode != 0, result.stdout
    assert "replaced by the backup taken before it and containerd runs it again" in result.stdout, result.stdout
    assert sh(fleet, "node1", f"sha256sum {main}") == before
    assert "gpunode" in sh(fleet, "node1", f"cat {FAILED}/containerd-*{main}")  # the failed one, kept
    modes = sh(fleet, "node1", f"stat -c '%a %n' {BACKUPS} {BACKUPS}/*.tar {FAILED} {FAILED}/*").split("\n")
    assert all(line.split()[0] in ("700", "600") for line in modes if line), modes


def test_a_second_run_is_refused_while_another_holds_the_node(fleet: Fleet, tmp_path: Path) -> None:
    """The node lock: held for a run's whole life, named to a second run, released when the
    holder is killed."""
    fleet.reset(["node1"])
    inventory = inventory_of(fleet, tmp_path, {"node1": {}})
    holder = tmp_path / "hold.py"
    holder.write_text(
        "from pyinfra.operations import server\n"
        "from pyinfra_gpunode.operations import rollout\n"
        "rollout.node_locked(name='lock')\n"
        "server.shell(name='hold', commands=['sleep 120'])\n"
    )
    pyinfra = cli.PYINFRA
    run = subprocess.Popen(
        [str(pyinfra), "-y", str(inventory), str(holder)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(300):
            if "pyinfra-gpunode run" in fleet.run("node1", "cat /run/pyinfra-gpunode/node.lock").stdout:
                break
            time.sleep(0.2)
        before = digest(fleet, "node1", "/etc")
        second = deploy(fleet, "-y", inventory=inventory)
        assert second.returncode != 0, second.stdout
        assert re.search(
            r"another run holds the node lock /run/pyinfra-gpunode/node.lock: "
            r"pyinfra-gpunode run \w+ from .* pid \d+ since",
            second.stdout,
        ), second.stdout
        assert digest(fleet, "node1", "/etc") == before
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    third = deploy(fleet, "-y", inventory=inventory)
    assert third.returncode == 0, third.stdout


def test_a_socket_activated_containerd_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    """A containerd.service that a socket activates is refused naming the socket; nothing is written."""
    fleet.reset(["node2"])
    sh(
        fleet,
        "node2",
        "printf '%s\\n' '[Socket]' 'ListenStream=/run/containerd/activation.sock' "
        "> /etc/systemd/system/containerd.socket && systemctl daemon-reload && systemctl stop containerd && "
        "systemctl start containerd.socket && systemctl start containerd",
    )
    before = (main_pid(fleet, "node2"), digest(fleet, "node2", "/etc/containerd"))

    result = deploy(fleet, "-y", inventory=inventory_of(fleet, tmp_path, {"node2": {}}))
    assert result.returncode != 0, result.stdout
    assert "[node2] containerd rollout failed: containerd.service is socket-activated by containerd.socket" in (
        result.stdout
    ), result.stdout
    assert (main_pid(fleet, "node2"), digest(fleet, "node2", "/etc/containerd")) == before


def test_mirrors_with_config_path_node_is_refused_before_its_turn(fleet: Fleet, tmp_path: Path) -> None:
    """node2 (containerd 1.7) runs the legacy ``registry.mirrors`` plus a drop-in setting ``config_path``: its CRI
    plugin starts (the drop-in owns it), but our file would carry both keys and the CRI plugin would refuse to
    start. The node is refused before its turn naming keys and files; its daemon keeps running; node3 halts."""
    fleet.reset(["node2", "node3"])
    images = '"io.containerd.grpc.v1.cri"'
    mirrors = f'[plugins.{images}.registry.mirrors."docker.io"]\n  endpoint = ["https://mirror.example"]\n'
    write(fleet, "node2", CONFIG, f"version = 2\n{IMPORTS}\n{mirrors}")
    write(fleet, "node2", f"{CONFD}/50-certs.toml", registry("/etc/containerd/certs.d"))
    sh(fleet, "node2", "systemctl restart containerd")
    assert "ConfigPath:/etc/containerd/certs.d" in running_runtimes(fleet, "node2")
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in ("node2", "node3")}

    result = deploy(fleet, "-y", inventory=inventory_of(fleet, tmp_path, {"node2": {}, "node3": {}}))
    output = result.stdout
    assert result.returncode != 0, output
    assert "[node2] containerd rollout failed: containerd config not changed: by the CRI plugin's start rules" in (
        output
    ), output
    assert "`mirrors` cannot be set when `config_path` is provided" in output
    assert f"mirrors (docker.io; in {CONFIG}" in output and f"{CONFD}/50-certs.toml" in output
    assert "halted: not touched after the failure on node2" in output
    assert {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in ("node2", "node3")} == (
        before
    )
    assert sh(fleet, "node2", "systemctl is-active containerd").strip() == "active"


def test_a_resumed_turn_restores_the_node_as_it_is_not_an_earlier_backup(fleet: Fleet, tmp_path: Path) -> None:
    """A failed turn is rolled back and keeps its mark; the operator then edits config.toml, and the earlier
    run's backup is pruned. The next run's turn fails the same way: it restores its own backup, taken of the
    node as it is, so the edit stays and containerd runs again (the earlier backup is neither used nor missed)."""
    fleet.reset(["node2"])
    sh(fleet, "node2", INJECT_FAILURE)
    inventory = inventory_of(fleet, tmp_path, {"node2": {}})
    first = deploy(fleet, "-y", inventory=inventory)
    assert first.returncode != 0 and "containerd failed after the restart" in first.stdout, first.stdout
    sh(fleet, "node2", "test -f /var/lib/pyinfra-gpunode/turn.json")  # the failed turn's mark, its backup named
    sh(fleet, "node2", "echo '# edited by the operator after the failed run' >> /etc/containerd/config.toml")
    sh(fleet, "node2", "rm -f /var/lib/pyinfra-gpunode/backup/containerd-*.tar")

    second = deploy(fleet, "-y", inventory=inventory)
    assert second.returncode != 0 and "containerd failed after the restart" in second.stdout, second.stdout
    assert "could not unpack" not in second.stdout, second.stdout
    assert sh(fleet, "node2", "systemctl is-active containerd").strip() == "active"
    sh(fleet, "node2", "grep -qx '# edited by the operator after the failed run' /etc/containerd/config.toml")
    sh(fleet, "node2", f"test ! -e {OUR_DROPIN}")
