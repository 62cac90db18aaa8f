"""A k0s node on a real systemd host: containerd 2.3.4 (the line k0s 1.36 runs, built from source) run as k0s
runs it, under a unit of k0s' name, on k0s' config, drop-in directory and socket; the nvidia runtime
registered by a drop-in in /etc/k0s/containerd.d written in the node's turn, verified, re-run without
change, and rolled back when containerd does not come up with it.

What is real: the containerd binary, its config dump and CRI plugin, systemd, the managed
/etc/k0s/containerd.toml as k0s 1.36 writes it (tests/samples/k0s-containerd-1.36.toml, source on its first
line, which is not planted). What is a STAND-IN, since the k0s binary is not available here:

- ``k0sworker.service`` runs containerd itself (k0s runs it as a child process) with the arguments k0s
  passes (pkg/component/worker/containerd/component.go), its root under /var/lib/containerd (the host's
  bind mount, so its snapshotter does not stack on the overlay root; k0s uses /var/lib/k0s/containerd);
- ``k0s-dropins.path`` + ``.service`` stand in for k0s' own watch of /etc/k0s/containerd.d: 3 s after a
  change there, SIGHUP to containerd (k0s sends the same; containerd exits on it and is started again);
- ``ExecStartPre`` of the unit refuses to start containerd while our drop-in sets ``enable_cdi = false``:
  a stand-in for a containerd that does not come up with a drop-in, to see the rollback.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dump import parse_cri_start_log
from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory

REPO = Path(__file__).resolve().parents[2]
NODE = "k0s1"  # Debian sid with containerd 2.3.4 bound over its own
SAMPLE = REPO / "tests" / "samples" / "k0s-containerd-1.36.toml"
SOCKET = "/run/k0s/containerd.sock"
DROPIN = "/etc/k0s/containerd.d/nvidia-gpunode.toml"
pytestmark = pytest.mark.fleet

WORKER_UNIT = """\
[Unit]
Description=Stand-in for k0s worker: containerd as k0s runs it (test)
# k0s' supervisor restarts containerd however often it fails
StartLimitIntervalSec=0
[Service]
ExecStartPre=/bin/sh -c '! grep -qs "enable_cdi = false" /etc/k0s/containerd.d/nvidia-gpunode.toml'
ExecStart=/usr/bin/containerd --root=/var/lib/containerd/k0s --state=/run/k0s/containerd \
--address=/run/k0s/containerd.sock --log-level=info --config=/etc/k0s/containerd.toml
Restart=always
RestartSec=1
KillMode=process
Delegate=yes
[Install]
WantedBy=multi-user.target
"""
WATCH_PATH = """\
[Unit]
Description=Stand-in for k0s' watch of its containerd drop-ins (test)
[Path]
PathChanged=/etc/k0s/containerd.d
Unit=k0s-dropins.service
[Install]
WantedBy=multi-user.target
"""
WATCH_SERVICE = """\
[Unit]
Description=Stand-in for k0s' restart of containerd 3 s after a drop-in changed (test)
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'sleep 3; systemctl kill --kill-whom=main -s HUP k0sworker.service || true'
"""


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    with fleet_factory.lent([HostSpec(NODE, "sid", containerd="2.3.4")], "k0s") as booted:
        yield booted


def sh(fleet: Fleet, command: str) -> str:
    result = fleet.run(NODE, command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def put(fleet: Fleet, path: str, text: str) -> None:
    sh(fleet, f"mkdir -p $(dirname {path}) && printf %s {shlex.quote(text)} > {path}")


def worker_pid(fleet: Fleet) -> str:
    return sh(fleet, "systemctl show -p MainPID --value k0sworker.service").strip()


def cri_up(fleet: Fleet, other_than: str = "", seconds: float = 60) -> str:
    """The PID of the unit's containerd once it is not ``other_than`` and ctr lists its CRI plugin ``ok``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = worker_pid(fleet)
        plugins = fleet.run(NODE, f"ctr --address {SOCKET} plugins ls").stdout
        if pid not in ("", "0", other_than) and any(
            line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
            for line in plugins.splitlines()
        ):
            return pid
        time.sleep(0.5)
    raise AssertionError(f"k0s' containerd not up: {fleet.run(NODE, 'systemctl status k0sworker').stdout}")


def k0s_node(fleet: Fleet, dropins: str = "mkdir -p /etc/k0s/containerd.d") -> str:
    """A fresh host laid out as a k0s 1.36 worker (``dropins``: how its drop-in directory is made); the PID
    of its containerd."""
    fleet.reset([NODE])
    put(fleet, "/etc/k0s/containerd.toml", SAMPLE.read_text().split("\n", 1)[1])
    put(fleet, "/etc/systemd/system/k0sworker.service", WORKER_UNIT)
    put(fleet, "/etc/systemd/system/k0s-dropins.path", WATCH_PATH)
    put(fleet, "/etc/systemd/system/k0s-dropins.service", WATCH_SERVICE)
    sh(
        fleet,
        "systemctl disable --now containerd.service && systemctl mask containerd.service && "
        f"{dropins} && systemctl daemon-reload && "
        "systemctl enable --now k0sworker.service k0s-dropins.path",
    )
    return cri_up(fleet)


def deploy(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, "--limit", NODE, fleet.inventory_path, "deploys/containerd_runtime.py")


def node_dump(fleet: Fleet) -> dict:
    """The node's own ``config dump`` of k0s' config, as JSON."""
    python = "import json, sys, tomllib; print(json.dumps(tomllib.loads(sys.stdin.read())))"
    return json.loads(
        sh(fleet, f"containerd --config /etc/k0s/containerd.toml config dump | python3 -c {shlex.quote(python)}")
    )


def readiness_links(fleet: Fleet, report: Path) -> dict[str, str]:
    """deploys/readiness.py on the node: each link's state and detail, by id."""
    cli.pyinfra(
        "-y", "--limit", NODE, "--data", f"gpunode_readiness_json={report}", fleet.inventory_path,
        "deploys/readiness.py", timeout=300,
    )  # fmt: skip
    (node,) = json.loads(report.read_text())["nodes"]
    return {link["id"]: f"{link['state']}: {link['detail']}" for link in node["links"]}


def loaded_runtimes(fleet: Fleet, pid: str) -> list[str]:
    """The runtimes the CRI plugin of containerd ``pid`` started with (its own start line in the journal)."""
    journal = sh(fleet, f"journalctl --no-pager -o cat _PID={pid}")
    loaded = parse_cri_start_log(journal.splitlines())
    assert loaded["loaded"], journal
    return sorted(loaded["runtimes"])


def test_the_drop_in_is_written_in_the_turn_verified_kept_and_rolled_back(fleet: Fleet, tmp_path: Path) -> None:
    pid = k0s_node(fleet)
    assert loaded_runtimes(fleet, pid) == ["runc"]

    plan = deploy(fleet, "--dry")
    assert plan.returncode == 0, plan.stdout
    assert f"plan: write {DROPIN}: k0s restarts its containerd about 3 s later" in plan.stdout, plan.stdout
    assert "the kubelet keeps running" in plan.stdout
    assert sh(fleet, f"ls /etc/k0s/containerd.d; test ! -e {DROPIN} && echo absent").strip() == "absent"
    assert worker_pid(fleet) == pid

    first = deploy(fleet, "-y")
    assert first.returncode == 0, first.stdout
    assert "k0s restarted its containerd" in first.stdout
    dropin = sh(fleet, f"cat {DROPIN}")
    assert "version = 3\n" in dropin and "io.containerd.grpc.v1.cri" not in dropin
    runtime = node_dump(fleet)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert runtime["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert runtime["default_runtime_name"] == "runc"
    written = cri_up(fleet)
    assert written != pid
    assert loaded_runtimes(fleet, written) == ["nvidia", "runc"]
    assert sh(fleet, "ls /var/lib/pyinfra-gpunode/backup").startswith("k0s-containerd-")
    # The report reads k0s' containerd (k0sworker, /etc/k0s/containerd.toml, its socket). Its restarts link is
    # not asserted: the stand-in's containerd is the unit's main process, so systemd logs k0s' SIGHUP.
    links = readiness_links(fleet, tmp_path / "readiness.json")
    assert links["containerd_config"].startswith("ok: containerd v2.3.4") and "nvidia (" in links["containerd_config"]
    assert links["containerd_running"] == f"ok: PID {written}: runtimes nvidia, runc", links
    assert links["runtime_writers"].startswith(f"ok: {DROPIN} (gpunode, BinaryName "), links
    assert worker_pid(fleet) == written

    again = deploy(fleet, "-y")
    assert again.returncode == 0, again.stdout
    assert "k0s restarted" not in again.stdout
    assert worker_pid(fleet) == written

    # A drop-in containerd does not come up with (the stand-in refuses enable_cdi = false): put back, failed.
    failed = deploy(fleet, "-y", "--data", "gpunode_enable_cdi=false", "--data", "gpunode_restart_timeout=8")
    assert failed.returncode != 0, failed.stdout
    assert f"k0s' containerd failed after the write of {DROPIN}: k0s did not start a new containerd" in failed.stdout
    assert "was put back as the backup taken before the write holds it, and k0s' containerd runs it again" in (
        failed.stdout
    ), failed.stdout
    assert sh(fleet, f"cat {DROPIN}") == dropin
    back = cri_up(fleet)
    assert back != written
    assert loaded_runtimes(fleet, back) == ["nvidia", "runc"]


def test_a_drop_in_directory_that_is_a_link_is_refused_and_nothing_written(fleet: Fleet) -> None:
    # made so before k0s starts: a change to the directory would restart its containerd
    pid = k0s_node(fleet, "mkdir /srv/k0s-dropins && ln -s /srv/k0s-dropins /etc/k0s/containerd.d")
    refusal = (
        "containerd config not changed: /etc/k0s/containerd.d is a symbolic link to /srv/k0s-dropins: gpunode "
        "writes real files only, never through a link"
    )

    plan = deploy(fleet, "--dry")
    assert refusal in plan.stdout, plan.stdout
    run = deploy(fleet, "-y")
    assert run.returncode != 0 and refusal in run.stdout, run.stdout
    assert sh(fleet, "ls -A /srv/k0s-dropins; readlink /etc/k0s/containerd.d").split() == ["/srv/k0s-dropins"]
    assert sh(fleet, "ls -A /var/lib/pyinfra-gpunode/backup 2>/dev/null || true").strip() == ""
    assert worker_pid(fleet) == pid
