"""The test fleet itself: hosts boot, are reached only with their real host keys, restart
containerd through systemd, reach the Debian archive and nothing else, and leave nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fleet import Fleet, HostSpec
from tests.fleet.cgroups import host_cgroups
from tests.fleet.nspawn import is_mounted, netns_name, unmount_all_under
from tests.fleet.plugin import Verify, require_fleet
from tests.fleet.processes import is_running
from tests.fleet.state import HostState

PROJECT = Path(__file__).resolve().parents[2]

EXPECTED_CONTAINERD = {"node1": "1.7.24", "node2": "1.7.24", "node3": "v2.3.4"}  # node3: the 2.3 build


@pytest.mark.fleet
def test_hosts_boot_with_their_own_identity(fleet: Fleet) -> None:
    machine_ids = set()
    for host in fleet.hosts:
        result = fleet.run(
            host.name, "hostname; cat /etc/machine-id; systemctl is-system-running; containerd --version"
        )
        hostname, machine_id, system_state, version = result.stdout.splitlines()
        assert (hostname, system_state) == (host.name, "running")
        assert f" {EXPECTED_CONTAINERD[host.name]}" in version
        machine_ids.add(machine_id)
    assert len(machine_ids) == len(fleet.hosts)


@pytest.mark.fleet
def test_ssh_requires_the_hosts_real_key(fleet: Fleet, tmp_path: Path) -> None:
    node1, node2 = fleet.host("node1"), fleet.host("node2")
    known = fleet.known_hosts_path.read_text().splitlines()
    node2_keys = [line.split(" ", 1)[1] for line in known if line.startswith(f"[127.0.0.1]:{node2.port} ")]
    assert len({line.split()[2] for line in known}) == len(known), "hosts share SSH host keys"

    wrong = tmp_path / "known_hosts"
    wrong.write_text("".join(f"[127.0.0.1]:{node1.port} {key}\n" for key in node2_keys))
    for known_hosts in (wrong, Path("/dev/null")):
        refused = subprocess.run(
            ["ssh", "-F", str(fleet.ssh_config_path), "-o", f"UserKnownHostsFile={known_hosts}", "node1", "true"],
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 255
        assert "Host key verification failed" in refused.stderr
    assert fleet.run("node1", "true").returncode == 0


@pytest.mark.fleet
def test_pyinfra_inventory_connects_with_strict_host_keys(fleet: Fleet) -> None:
    inventory = fleet.inventory_path.read_text()
    assert '"ssh_strict_host_key_checking": "yes"' in inventory
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(fleet.inventory_path), "exec", "--", "hostname"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for host in fleet.hosts:
        assert f"[{host.name}] {host.name}" in result.stdout + result.stderr


@pytest.mark.fleet
def test_containerd_restart_is_seen_by_systemd(fleet: Fleet) -> None:
    def main_pid() -> str:
        return fleet.run("node2", "systemctl show -p MainPID --value containerd").stdout.strip()

    before = main_pid()
    assert fleet.run("node2", "systemctl restart containerd").returncode == 0
    after = main_pid()
    assert after not in ("0", before)
    assert fleet.run("node2", "systemctl is-active containerd").stdout.strip() == "active"


@pytest.mark.fleet
def test_archive_reachable_and_nothing_else(fleet: Fleet) -> None:
    fleet.reset(["node2"])
    update = fleet.run("node2", "apt-get update -q")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "Err:" not in update.stdout
    elsewhere = fleet.run(
        "node2", "python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=3)'"
    )
    assert "Network is unreachable" in elsewhere.stderr


@pytest.mark.fleet
def test_reset_gives_a_fresh_disk_and_keeps_the_identity(fleet: Fleet) -> None:
    before = fleet.run("node2", "cat /etc/machine-id").stdout
    fleet.run("node2", "touch /root/written-before-reset")
    fleet.reset(["node2"])
    assert fleet.run("node2", "test -e /root/written-before-reset").returncode == 1
    assert fleet.run("node2", "cat /etc/machine-id").stdout == before


@pytest.mark.fleet
def test_reboot_boots_the_host_again(fleet: Fleet) -> None:
    fleet.reset(["node2"])
    boot_id = fleet.run("node2", "cat /proc/sys/kernel/random/boot_id").stdout
    fleet.run("node2", "systemctl reboot")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = fleet.run("node2", "systemctl is-system-running --wait; cat /proc/sys/kernel/random/boot_id")
        if state.stdout.startswith("running") and state.stdout.splitlines()[1:] != boot_id.splitlines():
            break
        time.sleep(0.5)
    else:
        pytest.fail("node2 did not come back from a reboot within 60 s")


@pytest.mark.fleet
def test_verification_suite_judges_a_fleet_host(fleet: Fleet, verify: Verify) -> None:
    """pyinfra_gpunode.verify runs against the fleet's inventory; an undeployed host fails the runtime checks."""
    fleet.reset(["node1"])
    result = verify(fleet, checks="containerd", hosts=["node1"])
    assert "test_containerd.py::test_containerd_active_and_enabled[node1] PASSED" in result.stdout, result.stdout
    assert "test_containerd.py::test_nvidia_runtime_in_merged_config[node1] FAILED" in result.stdout
    assert "node2" not in result.stdout and "test_host.py" not in result.stdout


@pytest.mark.vm
def test_vm_host_has_a_kernel_of_its_own(vm_fleet: Fleet, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other_key = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{vm_fleet.host('vm1').port} {other_key}\n")
    refused = subprocess.run(
        ["ssh", "-F", str(vm_fleet.ssh_config_path), "-o", f"UserKnownHostsFile={wrong}", "vm1", "true"],
        capture_output=True,
        text=True,
    )
    assert "Host key verification failed" in refused.stderr

    result = vm_fleet.run("vm1", "uname -r; modprobe overlay && grep -c '^overlay ' /proc/modules")
    assert result.returncode == 0, result.stderr
    kernel, loaded = result.stdout.split()
    assert kernel != os.uname().release
    assert loaded == "1"


@pytest.mark.fleet
def test_down_leaves_nothing_behind() -> None:
    require_fleet()
    fleet = Fleet([HostSpec("teardown1", "trixie")], name="teardown")
    fleet.up()
    fleet.up()  # idempotent: nothing new is started
    (state,) = [HostState.load(path.parent) for path in fleet.directory.glob("*/host.json")]
    recorded = state.processes
    assert recorded and all(is_running(p) for p in recorded)
    assert fleet.run("teardown1", "true").returncode == 0

    fleet.down()
    fleet.down()
    assert not any(is_running(p) for p in recorded)
    assert not _processes_mentioning(str(fleet.directory))
    with open("/proc/self/mountinfo") as mountinfo:
        assert str(fleet.directory) not in mountinfo.read()
    assert not Path("/run/netns", netns_name("teardown1")).exists()
    assert not any(path.exists() for path in host_cgroups("teardown1"))
    assert not fleet.directory.exists()


@pytest.mark.parametrize("distro", ["", "ubuntu", "debian"])
def test_vagrantfile_validates(distro: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPUNODE_DISTRO": distro,
        "VAGRANT_HOME": str(tmp_path / "home"),
        "VAGRANT_DOTFILE_PATH": str(tmp_path / "dotfile"),
    }
    if not distro:
        del env["GPUNODE_DISTRO"]
    result = subprocess.run(
        ["vagrant", "validate", "--ignore-provider"], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Vagrantfile validated successfully" in result.stdout


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live (not zombie) processes that mention ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(cmdline)
    return found


def test_removal_unmounts_what_an_interrupted_boot_left(tmp_path: Path) -> None:
    """A host's directory with mounts left inside (nested, one under a name with a space) is unmounted
    deepest first, so ``rm -rf --one-file-system`` can remove it; a mount beside it is left alone."""
    require_fleet()
    host, beside = tmp_path / "vm1", tmp_path / "vm1-other"
    points = [host / "image source", host / "image source" / "inner", host / "merged", beside]
    try:
        for point in points:
            point.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)
        unmount_all_under(host)
        assert [is_mounted(point) for point in points] == [False, False, False, True]
        subprocess.run(["rm", "-rf", "--one-file-system", str(host)], check=True)
        assert not host.exists()
    finally:
        for point in reversed(points):
            if is_mounted(point):
                subprocess.run(["umount", str(point)], check=True)
