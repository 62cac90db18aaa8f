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
from tests.integration.gpu_state import DRIVER, LIBRARY, LIBRARY_DIR, cdi_spec, libnvidia_ml
from tests.integration.summary import summary_rows

REPO = Path(__file__).resolve().parents[2]
PLANTED = "/root/gpunode-planted-driver"
PERSISTENCED = b"""[Unit]
Description=NVIDIA Persistence Daemon (stand-in)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
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
    sys_files = {
        "pci/0000:41:00.0/vendor": "0x10de", "pci/0000:41:00.0/class": "0x030200",
        "pci/0000:41:00.0/device": "0x2331", "module/nvidia/version": DRIVER,
    }  # fmt: skip
    script = [f"mkdir -p {PLANTED}/{path.rsplit('/', 1)[0]} && echo {value} > {PLANTED}/{path}"
              for path, value in sys_files.items()]  # fmt: skip
    proc = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Tue Apr  1 00:00:00 UTC 2025"
    script += [
        f"mkdir -p {PLANTED}/proc/nvidia && echo '{proc}' > {PLANTED}/proc/nvidia/version",
        f"mount --bind {PLANTED}/pci /sys/bus/pci/devices",
        f"mount --bind {PLANTED}/module /sys/module",
        f"mount --bind {PLANTED}/proc /proc/driver",
    ]
    try:
        on(fleet, " && ".join(script))
        on(fleet, f"mkdir -p {LIBRARY_DIR} && cat > {LIBRARY}", libnvidia_ml().read_bytes())
        on(fleet, f"echo {LIBRARY_DIR} > /etc/ld.so.conf.d/nvidia.conf && ldconfig")
        ctk = "#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\n"
        on(fleet, "cat > /usr/local/bin/nvidia-ctk && chmod 755 /usr/local/bin/nvidia-ctk", ctk.encode())
        runtime = "/usr/bin/nvidia-container-runtime"
        on(fleet, f"cat > {runtime} && chmod 755 {runtime}", b"#!/bin/sh\n")
        on(fleet, "mkdir -p /etc/cdi && cat > /etc/cdi/nvidia.yaml", cdi_spec().encode())
        # nvidia-persistenced as the driver's package installs it, disabled; a stand-in daemon (the real one
        # exits without a GPU device it can open)
        on(fleet, "cat > /etc/systemd/system/nvidia-persistenced.service && systemctl daemon-reload", PERSISTENCED)
        yield
    finally:
        fleet.run("node1", "umount /sys/bus/pci/devices; umount /sys/module; umount /proc/driver")
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
