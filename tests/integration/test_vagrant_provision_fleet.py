"""The Vagrantfile's provisioner on a real Debian host without containerd: installed, enabled, running,
unchanged on a second run, and deploys/gpu_node.py then runs to the end."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "vagrant-provision.sh"
NODE = "vagrant1"  # Debian trixie


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    """A fleet of its own: the test purges and resets its host."""
    with fleet_factory.lent([HostSpec(NODE, "trixie")], "vagrant-provision") as booted:
        yield booted


def sh(fleet: Fleet, command: str) -> str:
    result = fleet.run(NODE, command, timeout=300)
    assert result.returncode == 0, f"{command}: {result.stdout}{result.stderr}"
    return result.stdout


def provision(fleet: Fleet) -> str:
    """Upload and run the script as Vagrant's shell provisioner does (as root)."""
    return sh(fleet, f"printf %s {shlex.quote(SCRIPT.read_text())} > /tmp/vagrant-shell && sh /tmp/vagrant-shell")


def state(fleet: Fleet) -> str:
    return sh(fleet, "systemctl is-enabled containerd; systemctl is-active containerd")


@pytest.mark.fleet
def test_provisioner_installs_containerd_once_and_the_deploy_runs_to_the_end(fleet: Fleet) -> None:
    fleet.reset([NODE])
    sh(fleet, "systemctl disable --now containerd && apt-get purge -y -q containerd && ! command -v containerd")

    out = provision(fleet)
    assert "containerd github.com/containerd/containerd" in out
    assert state(fleet) == "enabled\nactive\n"
    assert sh(fleet, "head -n 1 /etc/containerd/config.toml") == "version = 2\n"  # as Debian's package ships it

    history = sh(fleet, "md5sum /var/log/apt/history.log")
    pid = sh(fleet, "systemctl show -p MainPID --value containerd")
    provision(fleet)
    assert sh(fleet, "md5sum /var/log/apt/history.log") == history  # no apt run the second time
    assert sh(fleet, "systemctl show -p MainPID --value containerd") == pid  # containerd left running as it was

    sh(fleet, "systemctl stop containerd")
    provision(fleet)
    assert state(fleet) == "enabled\nactive\n"

    deploy = cli.pyinfra("-y", "--limit", NODE, fleet.inventory_path, "deploys/gpu_node.py")
    assert deploy.returncode == 0, deploy.stdout
    assert "containerd.runtimes.nvidia]" in sh(fleet, "containerd config dump")


def test_provisioner_is_shellcheck_clean() -> None:
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
