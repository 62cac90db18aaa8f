"""Host preparation run for real through pyinfra against a Debian trixie root, checked with apt and systemd.

The root is debootstrapped once into ``${GPUNODE_CACHE:-/var/cache/pyinfra-gpunode}/roots`` and each
test works on an overlay copy of it in a temporary directory, reached with pyinfra's ``@chroot``
connector. Needs root and debootstrap; the Debian archive is the one this machine's apt uses.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.facts import get_facts
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.driver_plan import DriverRequest, HostInfo, check_request, plan_driver, wanted_names
from pyinfra_gpunode.facts.driver import NvidiaHostState
from pyinfra_gpunode.facts.package_index import NvidiaAptVersions
from pyinfra_gpunode.facts.unattended_upgrades import APT_CONF, NEEDRESTART_CONF
from pyinfra_gpunode.operations import kernel, unattended_upgrades

pytestmark = [
    pytest.mark.chroot,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, overlay mounts)"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="needs debootstrap"),
]

NEEDRESTART_EVAL = r"""
our %nrconf;
do "/etc/needrestart/needrestart.conf";
do $_ for sort glob "/etc/needrestart/conf.d/*.conf";
print "restart=$nrconf{restart}\n";
for my $unit ("containerd.service", "kubelet.service", "nvidia-persistenced.service", "cron.service") {
    my $skip = grep { $unit =~ $_ && !$nrconf{override_rc}{$_} } keys %{$nrconf{override_rc}};
    print "$unit=", ($skip ? "never" : "restart"), "\n";
}
"""

from tests.fleet.archive import debian_mirror  # noqa: E402
from tests.fleet.roots import HOSTPREP_RELEASE as RELEASE  # noqa: E402
from tests.fleet.roots import hostprep_root, writable_copy  # noqa: E402

logging.getLogger("paramiko").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def base_root() -> Path:
    """The cached trixie root with a kernel (built on first use, under a lock)."""
    return hostprep_root()


@pytest.fixture
def node(base_root: Path, tmp_path: Path) -> Iterator[Path]:
    """A writable overlay copy of the root for one test."""
    with writable_copy(base_root, tmp_path) as merged:
        yield merged


def sh(root: Path, command: str) -> str:
    result = subprocess.run(
        ["chroot", str(root), "sh", "-c", command], capture_output=True, text=True, check=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    )  # fmt: skip
    return result.stdout


def deploy(root: Path, *ops: tuple[Callable[..., Any], dict[str, Any]]) -> int:
    """Run ``ops`` on the root through pyinfra; return how many ops would change it (prepare pass)."""
    return _run(Inventory(([f"@chroot/{root}"], {})), *ops)


def _run(inventory: Inventory, *ops: tuple[Callable[..., Any], dict[str, Any]]) -> int:
    """Run ``ops`` on the inventory's one host; return how many would change it (prepare pass)."""
    state = State(inventory=inventory, config=Config(FAIL_PERCENT=0), check_for_changes=True)
    connect_all(state)
    try:
        (host,) = inventory
        for op, kwargs in ops:
            add_op(state, op, **kwargs)
        changes = state.get_meta_for_host(host).ops_change
        run_ops(state)
        assert not state.failed_hosts, "an operation failed"
        return int(changes)
    finally:
        disconnect_all(state)


def installed_kernel(root: Path) -> str:
    return os.readlink(root / "vmlinuz").rsplit("vmlinuz-", 1)[1]


def test_kernel_held_then_released(node: Path) -> None:
    release = installed_kernel(node)
    assert sh(node, "apt-mark showhold") == ""

    op = (kernel.held, {"name": "hold kernel", "release": release})
    assert deploy(node, op) == 1
    held = sh(node, "apt-mark showhold").split()
    assert held == sorted([f"linux-image-{release}", "linux-image-cloud-amd64"])
    status = sh(node, "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' linux-image-cloud-amd64")
    assert status.startswith("hi")
    assert deploy(node, op) == 0, "second run changed something"

    release_op = (kernel.held, {"name": "release kernel", "release": release, "present": False})
    assert deploy(node, release_op) == 1
    assert sh(node, "apt-mark showhold") == ""
    assert deploy(node, release_op) == 0


def periodic(root: Path) -> dict[str, str]:
    dump = sh(root, "apt-config dump")
    return dict(re.findall(r'^APT::Periodic::(\S+) "(.*)";$', dump, re.M))


def blacklist(root: Path) -> list[str]:
    return re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', sh(root, "apt-config dump"), re.M)


def is_enabled(root: Path, *units: str) -> list[str]:
    result = subprocess.run(
        ["chroot", str(root), "systemctl", "is-enabled", *units], capture_output=True, text=True, check=False
    )
    return result.stdout.split()


def test_unattended_disabled_then_blacklist(node: Path) -> None:
    units = ("apt-daily-upgrade.timer", "apt-daily.timer", "unattended-upgrades.service")
    assert periodic(node)["Unattended-Upgrade"] == "1"
    assert is_enabled(node, *units) == ["enabled"] * 3
    needrestart = sh(node, f"perl -e '{NEEDRESTART_EVAL}'")
    assert "containerd.service=restart" in needrestart

    op = (unattended_upgrades.configured, {"name": "unattended off"})
    assert deploy(node, op) == 1
    settings = periodic(node)
    assert settings["Unattended-Upgrade"] == "0"
    assert settings["Update-Package-Lists"] == "0"
    assert settings["Enable"] == "0"
    assert is_enabled(node, *units) == ["disabled"] * 3
    needrestart = sh(node, f"perl -e '{NEEDRESTART_EVAL}'").split()
    assert needrestart == [
        "restart=l",
        "containerd.service=never",
        "kubelet.service=never",
        "nvidia-persistenced.service=never",
        "cron.service=restart",
    ]
    mode = sh(node, "stat -c '%a %U %G' /etc/apt/apt.conf.d/99gpunode-unattended-upgrades "
                    "/etc/needrestart/conf.d/90-gpunode.conf").split("\n")  # fmt: skip
    assert mode[:2] == ["644 root root", "644 root root"]
    assert deploy(node, op) == 0, "second run changed something"

    op = (unattended_upgrades.configured, {"name": "unattended blacklist", "mode": "blacklist"})
    assert deploy(node, op) == 1
    settings = periodic(node)
    assert settings["Unattended-Upgrade"] == "1"
    assert "Enable" not in settings
    assert blacklist(node) == ["linux-", "nvidia-", "libnvidia-", "containerd", "cri-tools"]
    assert is_enabled(node, *units) == ["enabled"] * 3
    assert deploy(node, op) == 0, "second run changed something"


def test_driver_plan_dry_run_debian(node: Path) -> None:
    """No GPU here: check the Debian driver plan against the real package index (non-free)."""
    components = "main contrib non-free non-free-firmware"
    (node / "etc/apt/sources.list").write_text(f"deb {debian_mirror()} {RELEASE} {components}\n")
    sh(node, "apt-get update -qq")
    name = f"@chroot/{node}"
    inventory = Inventory(([name], {}))
    state = State(inventory=inventory, config=Config())
    connect_all(state)
    try:
        host = inventory.get_host(name)
        facts = get_facts(state, NvidiaHostState)[host]
        assert facts["distro"] == "debian" and facts["release"] == "13"
        assert facts["pci"]["gpus"] == []  # the op itself would skip this host
        info = HostInfo("debian", facts["release"], installed_kernel(node), facts["arch"], False)
        request = check_request(DriverRequest(branch="550", flavor="default", allow_dkms=True))
        available = get_facts(state, NvidiaAptVersions, kwargs={"packages": wanted_names(info, request)})[host]
        headers = f"linux-headers-{info.kernel}"
        assert get_facts(state, NvidiaAptVersions, kwargs={"packages": [headers]})[host].get(headers)
    finally:
        disconnect_all(state)
    plan = plan_driver(info, request, {}, available)
    assert plan.error == ""
    assert plan.method == "dkms"
    assert sorted(plan.packages) == [
        "firmware-nvidia-gsp", "libcuda1", headers, "nvidia-driver", "nvidia-kernel-dkms", "nvidia-persistenced",
        "nvidia-smi",
    ]  # fmt: skip
    assert plan.version.startswith("550.")
    assert plan.packages.pop(headers) == ""  # the running kernel's headers, as the index has them
    assert plan.packages.pop("nvidia-persistenced") == available["nvidia-persistenced"][0]  # contrib's, its own version
    assert all(v.startswith(plan.version + "-") for v in plan.packages.values())

    refused = plan_driver(info, check_request(DriverRequest(branch="550", flavor="default")), {}, available)
    assert "allow_dkms" in refused.error
    secure = HostInfo("debian", "13", info.kernel, "amd64", True)
    request = check_request(DriverRequest(branch="550", flavor="default", allow_dkms=True))
    assert "Secure Boot" in plan_driver(secure, request, {}, available).error


# ---- the same checks on a booted test host (systemd running, reached over SSH) -------------


def fleet_deploy(fleet: Any, name: str, *ops: tuple[Callable[..., Any], dict[str, Any]]) -> int:
    """Run ``ops`` on fleet host ``name``; return how many would change it (prepare pass)."""
    import runpy

    hosts = runpy.run_path(str(fleet.inventory_path))["hosts"]
    return _run(Inventory(([entry for entry in hosts if entry[0] == name], {})), *ops)


@pytest.mark.vm
def test_vm_host_prep_converges(vm_fleet: Any) -> None:
    """On a qemu host, whose running kernel is a Debian package (an nspawn host runs this machine's)."""
    fleet, node = vm_fleet, "vm1"
    # A fresh disk costs a reboot, minutes under emulation: taken only where a run before left its marks.
    marks = fleet.run(
        node, f"apt-mark showhold; for f in {APT_CONF} {NEEDRESTART_CONF}; do [ ! -e $f ] || echo $f; done"
    )
    if marks.returncode != 0 or marks.stdout.strip():
        fleet.reset([node])

    def out(command: str) -> str:
        result = fleet.run(node, command)
        assert result.returncode == 0, result.stderr
        return result.stdout

    release = out("readlink /vmlinuz").strip().rsplit("vmlinuz-", 1)[-1]
    ops = (
        (unattended_upgrades.configured, {"name": "unattended off"}),
        (kernel.held, {"name": "hold kernel", "release": release}),
    )
    assert fleet_deploy(fleet, node, *ops) == 2
    assert re.search(r'^APT::Periodic::Unattended-Upgrade "0";$', out("apt-config dump"), re.M)
    enabled = fleet.run(node, "systemctl is-enabled apt-daily-upgrade.timer apt-daily.timer").stdout.split()
    assert enabled == ["disabled", "disabled"]
    active = fleet.run(node, "systemctl is-active apt-daily-upgrade.timer apt-daily.timer").stdout.split()
    assert active == ["inactive", "inactive"]
    assert f"linux-image-{release}" in out("apt-mark showhold").split()
    assert out("cat /etc/needrestart/conf.d/90-gpunode.conf").count("= 0;") == 3
    assert fleet_deploy(fleet, node, *ops) == 0, "second run changed something"
