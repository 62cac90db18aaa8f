"""A k3s agent node on a real systemd host: Debian trixie's containerd 1.7.24 run as k3s runs it, under
k3s' unit name, on k3s' generated config and socket. gpunode writes nothing there: without the NVIDIA
Container Toolkit's runtime the node is refused; with it, k3s adds the nvidia runtime itself at its start,
so the rollout restarts ``k3s-agent.service`` in the node's turn and verifies it; a re-run changes nothing.

What is real: the containerd binary, its CRI plugin and start line, systemd, and the config k3s generates
(``tests/samples/k3s-containerd-config.toml``, source on its first line, which is not planted). What is a
STAND-IN, since the k3s binary is not available here:

- ``k3s-agent.service`` runs containerd itself (k3s runs it as a child of its agent, next to the kubelet)
  with the arguments k3s passes (``pkg/agent/containerd/config_linux.go``: ``-c``, ``-a``, ``--state``,
  ``--root``); its root is under /var/lib/containerd (the host's bind mount, so its overlayfs snapshotter
  does not stack on the overlay root; k3s uses /var/lib/rancher/k3s/agent/containerd);
- its ``ExecStartPre`` stands in for what k3s does at every start: it writes
  /var/lib/rancher/k3s/agent/etc/containerd/config.toml afresh from the rendered template and adds the
  runtimes ``pkg/agent/containerd/runtimes.go`` (``findNvidiaContainerRuntimes``) finds: ``nvidia`` and
  ``nvidia-experimental`` (``io.containerd.runc.v2``, ``BinaryName`` the path found) for
  ``nvidia-container-runtime`` and ``nvidia-container-runtime-experimental`` in /usr/local/nvidia/toolkit,
  else /usr/bin, rendered as the template's ``ExtraRuntimes`` blocks (no ``config.toml.tmpl`` handling);
- containerd's output goes to /var/lib/rancher/k3s/agent/containerd/containerd.log, as k3s sends it
  (``pkg/agent/containerd``: ``Containerd.Log``), so its unit's journal has no CRI start line;
- /usr/bin/nvidia-container-runtime, where planted, is a script that runs runc (the toolkit is not
  installed: nothing runs containers on these hosts).
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
NODE = "k3s1"  # Debian trixie: containerd 1.7.24, which k3s releases with the version-2 template ship
SAMPLE = REPO / "tests" / "samples" / "k3s-containerd-config.toml"
CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
SOCKET = "/run/k3s/containerd/containerd.sock"
UNIT = "k3s-agent.service"
STAND_IN = "/usr/local/lib/k3s-stand-in"
LOG = "/var/lib/rancher/k3s/agent/containerd/containerd.log"  # k3s' containerd logs here, not to the journal
TOOLKIT = "/usr/bin/nvidia-container-runtime"
pytestmark = pytest.mark.fleet

AGENT_UNIT = f"""\
[Unit]
Description=Stand-in for the k3s agent: containerd as k3s runs it (test)
[Service]
Type=notify
ExecStartPre={STAND_IN}/generate-config
ExecStart=/usr/bin/containerd -c {CONFIG} -a {SOCKET} --state /run/k3s/containerd --root /var/lib/containerd/k3s
StandardOutput=append:{LOG}
StandardError=append:{LOG}
Restart=always
RestartSec=5s
KillMode=process
Delegate=yes
[Install]
WantedBy=multi-user.target
"""
# k3s' own start: the template rendered afresh, with the nvidia runtimes it finds (see the module's docstring).
GENERATE_CONFIG = f"""\
#!/bin/sh
set -e
mkdir -p {CONFIG.rsplit("/", 1)[0]}
{{
    cat {STAND_IN}/config.toml.rendered
    for pair in nvidia:nvidia-container-runtime nvidia-experimental:nvidia-container-runtime-experimental; do
        name=${{pair%%:*}}
        binary=${{pair#*:}}
        for location in /usr/local/nvidia/toolkit /usr/bin; do
            if [ -e "$location/$binary" ] && [ ! -d "$location/$binary" ]; then
                printf '\\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."%s"]\\n' "$name"
                printf '  runtime_type = "io.containerd.runc.v2"\\n'
                printf '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."%s".options]\\n' "$name"
                printf '  BinaryName = "%s"\\n' "$location/$binary"
                break
            fi
        done
    done
    echo
}} > {CONFIG}.partial
mv -f {CONFIG}.partial {CONFIG}
"""
TOOLKIT_STAND_IN = '#!/bin/sh\nexec runc "$@"\n'


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    with fleet_factory.lent([HostSpec(NODE, "trixie")], "rancher") as booted:
        yield booted


def sh(fleet: Fleet, command: str) -> str:
    result = fleet.run(NODE, command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def put(fleet: Fleet, path: str, text: str, mode: str = "644") -> None:
    sh(fleet, f"mkdir -p $(dirname {path}) && printf %s {shlex.quote(text)} > {path} && chmod {mode} {path}")


def agent_pid(fleet: Fleet) -> str:
    return sh(fleet, f"systemctl show -p MainPID --value {UNIT}").strip()


def cri_up(fleet: Fleet, other_than: str = "", seconds: float = 60) -> str:
    """The PID of the unit's containerd once it is not ``other_than`` and ctr lists its CRI plugin ``ok``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = agent_pid(fleet)
        plugins = fleet.run(NODE, f"ctr --address {SOCKET} plugins ls").stdout
        if pid not in ("", "0", other_than) and any(
            line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
            for line in plugins.splitlines()
        ):
            return pid
        time.sleep(0.5)
    raise AssertionError(f"k3s' containerd not up: {fleet.run(NODE, f'systemctl status {UNIT}').stdout}")


def k3s_node(fleet: Fleet) -> str:
    """A fresh host laid out as a k3s agent without the toolkit; the PID of its containerd."""
    fleet.reset([NODE])
    put(fleet, f"{STAND_IN}/config.toml.rendered", SAMPLE.read_text().split("\n", 1)[1])
    put(fleet, f"{STAND_IN}/generate-config", GENERATE_CONFIG, mode="755")
    put(fleet, f"/etc/systemd/system/{UNIT}", AGENT_UNIT)
    sh(
        fleet,
        "systemctl disable --now containerd.service && systemctl mask containerd.service && "
        f"mkdir -p {LOG.rsplit('/', 1)[0]} && systemctl daemon-reload && systemctl enable --now {UNIT}",
    )
    return cri_up(fleet)


def deploy(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, "--limit", NODE, fleet.inventory_path, "deploys/containerd_runtime.py")


def readiness(fleet: Fleet, report: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """deploys/readiness.py on the node: its process and each link's state and detail, by id."""
    result = cli.pyinfra(
        "-y", "--limit", NODE, "--data", f"gpunode_readiness_json={report}", fleet.inventory_path,
        "deploys/readiness.py", timeout=300,
    )  # fmt: skip
    (node,) = json.loads(report.read_text())["nodes"]
    return result, {link["id"]: f"{link['state']}: {link['detail']}" for link in node["links"]}


def loaded_runtimes(fleet: Fleet) -> list[str]:
    """The runtimes the CRI plugin of the last containerd started with (its start line in k3s' containerd log)."""
    line = sh(fleet, f"grep -E 'Start cri plugin with config' {LOG} | tail -n 1")
    loaded = parse_cri_start_log(line.splitlines())
    assert loaded["loaded"], sh(fleet, f"tail -n 20 {LOG}")
    return sorted(loaded["runtimes"])


def node_files(fleet: Fleet) -> str:
    """What gpunode could have written: k3s' containerd directory, /etc/containerd and gpunode's own state."""
    return sh(
        fleet,
        "find /var/lib/rancher/k3s/agent/etc /etc/containerd /var/lib/pyinfra-gpunode -type f 2>/dev/null | "
        "sort | xargs -r sha256sum",
    )


def test_k3s_adds_nvidia_at_the_unit_restart_in_the_turn(fleet: Fleet, tmp_path: Path) -> None:
    pid = k3s_node(fleet)
    assert sh(fleet, f"grep -m 1 -v '^$' {CONFIG}").strip() == (
        "# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead."
    )
    assert loaded_runtimes(fleet) == ["runc"]
    before = node_files(fleet)

    # No toolkit: k3s would not add nvidia, and gpunode does not edit what k3s generates.
    refused = deploy(fleet, "-y")
    assert refused.returncode != 0, refused.stdout
    assert f"k3s owns containerd here: it runs containerd inside its unit (k3s.service, {UNIT}) on {SOCKET}" in (
        refused.stdout
    ), refused.stdout
    assert "neither is there (install the NVIDIA Container Toolkit" in refused.stdout
    assert node_files(fleet) == before
    assert agent_pid(fleet) == pid

    put(fleet, TOOLKIT, TOOLKIT_STAND_IN, mode="755")
    plan = deploy(fleet, "--dry")
    assert plan.returncode == 0, plan.stdout
    assert (
        f"plan: {UNIT} must be restarted, the kubelet with it: k3s adds the nvidia runtime itself at its start, "
        f"and it finds {TOOLKIT}, but {CONFIG} has no nvidia runtime yet; restart it and verify"
    ) in plan.stdout, plan.stdout
    assert node_files(fleet) == before
    assert agent_pid(fleet) == pid

    rolled = deploy(fleet, "-y")
    assert rolled.returncode == 0, rolled.stdout
    assert "done: containerd restarted and verified" in rolled.stdout, rolled.stdout
    restarted = cri_up(fleet)
    assert restarted != pid
    assert loaded_runtimes(fleet) == ["nvidia", "runc"]
    generated = sh(fleet, f"cat {CONFIG}")
    assert f'runtimes."nvidia".options]\n  BinaryName = "{TOOLKIT}"' in generated
    assert not sh(fleet, "ls /etc/containerd/conf.d /etc/containerd/gpunode 2>/dev/null || true").strip()

    again = deploy(fleet, "-y")
    assert again.returncode == 0, again.stdout
    assert f"k3s adds the nvidia runtime itself: found in {CONFIG}" in again.stdout, again.stdout
    assert agent_pid(fleet) == restarted
    assert sh(fleet, f"cat {CONFIG}") == generated

    # The report reads k3s' containerd (its unit, generated config and socket), not containerd.service's.
    report, links = readiness(fleet, tmp_path / "readiness.json")
    assert report.returncode == 0, report.stdout
    assert "1 of 1 nodes ready" in report.stdout, report.stdout
    assert links["containerd_config"] == f"ok: containerd 1.7.24~ds1: nvidia ({TOOLKIT}), default runc", links
    assert links["containerd_running"] == f"ok: PID {restarted}: runtimes nvidia, runc", links
    assert links["containerd_restarts"].startswith("ok: "), links
    assert links["runtime_handler"] == f"ok: nvidia: {TOOLKIT}", links
    assert agent_pid(fleet) == restarted
