"""A booted GPU node whose driver was installed outside apt, with no host data: dry run, then a prepared node.

node1 (systemd, containerd 1.7) gets an H100 on its PCI bus and driver module DRIVER loaded: the
files are written inside the container and bind-mounted there over ``/sys/bus/pci/devices``,
``/sys/module`` and ``/proc/driver`` (the container's own mount namespace; undone afterwards). Debian's real
libnvidia-ml is copied in outside any package and registered with ldconfig; the toolkit's two
binaries stand on PATH outside dpkg and the CDI spec is current, as on an image-built node.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.fleet import Fleet
from tests.integration.gpu_state import DRIVER, UNPLANT, plant_preinstalled_driver
from tests.integration.summary import summary_rows

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.fleet


def on(fleet: Fleet, command: str, data: bytes | None = None) -> str:
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), "node1", command], input=data, capture_output=True, timeout=120
    )
    assert done.returncode == 0, f"{command}: {done.stderr.decode()}"
    return done.stdout.decode()


@pytest.fixture
def preinstalled_node1(fleet: Fleet) -> Iterator[None]:
    fleet.reset(["node1"])
    try:
        plant_preinstalled_driver(lambda command, data: on(fleet, command, data))
        yield
    finally:
        fleet.run("node1", UNPLANT)
        fleet.reset(["node1"])


def deploy(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, "--limit", "node1", fleet.inventory_path, "deploys/gpu_node.py")


def test_preinstalled_driver_without_host_data_goes_from_plan_to_prepared_node(
    fleet: Fleet, preinstalled_node1: None
) -> None:
    etc = on(fleet, "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum")
    dry = deploy(fleet, "--dry")
    assert dry.returncode == 0, dry.stdout
    assert f"[node1] plan: driver {DRIVER} (proprietary) preinstalled" in dry.stdout
    assert "[node1] plan: write /etc/containerd/gpunode/nvidia-runtime.toml, /etc/containerd/config.toml" in dry.stdout
    assert on(fleet, "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum") == etc
    assert on(fleet, "systemctl is-active nvidia-persistenced || true").strip() == "inactive"

    run = deploy(fleet, "-y")
    assert run.returncode == 0, run.stdout
    row = summary_rows(run.stdout)["node1"]
    assert f"driver {DRIVER} (proprietary) preinstalled" in row and "done" in row, run.stdout
    assert on(fleet, "dpkg-query -W -f='${Package}\\n' 'nvidia*' 'libnvidia*' 2>/dev/null || true") == ""
    assert "nvidia" not in on(fleet, "apt-mark showhold")
    invocation = on(fleet, "systemctl show -p InvocationID --value containerd").strip()
    cri = on(fleet, f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation} | grep 'Start cri plugin'")
    assert "nvidia" in cri
    # an H100 (a datacenter GPU): persistence mode on by default, its daemon enabled and running
    assert on(fleet, "systemctl is-enabled nvidia-persistenced; systemctl is-active nvidia-persistenced").split() == [
        "enabled", "active",
    ]  # fmt: skip

    again = deploy(fleet, "-y", "--debug")
    assert again.returncode == 0, again.stdout
    assert on(fleet, "systemctl show -p InvocationID --value containerd").strip() == invocation
    # A prepared GPU node is read with one command (its snapshot) for every step, GPU steps included.
    assert again.stdout.count("Running command on node1: ") == 1, again.stdout

    # Persistence mode asked on and its daemon stopped: the readiness report warns, naming it.
    on(fleet, "systemctl stop nvidia-persistenced")
    report = cli.pyinfra("--dry", "--limit", "node1", fleet.inventory_path, "deploys/readiness.py")
    assert "warning: persistence mode is asked on, but nvidia-persistenced.service is inactive" in report.stdout, (
        report.stdout
    )
