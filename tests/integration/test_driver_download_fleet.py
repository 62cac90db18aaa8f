"""Driver packages downloaded before the rollout's turns, on three systemd hosts (trixie).

Each host shows an NVIDIA GPU and a loaded nvidia module, and reads a local apt repository of small
test packages standing for Debian's driver packages (``nvidia-driver``, ``firmware-nvidia-gsp``, ``libcuda1``,
``nvidia-smi``,
``nvidia-kernel-dkms`` and the running kernel's headers), built here with ``dpkg-deb`` and served
with apt's ``copy:`` method, which fetches into ``/var/cache/apt/archives`` as a remote repository
does. The before-hook is a real program: at each turn it lists every node's apt cache, then makes
its node's repository unreachable, so the turn's install succeeds only from the cache. dl3's
repository lists the packages and has lost their files: its download fails before any turn.

A driver change that does not load after its reboot: dl1 runs driver OLD_DRIVER from packages whose module
package ships a stand-in ``nvidia.ko`` (its ``.modinfo`` names the version and the kernel, as ``modinfo`` reads
a DKMS build) and changes to DRIVER, which the node "refuses" at boot: a unit run at every boot shows the
module ``modprobe nvidia`` would load as loaded unless its version is refused, as a GPU-less kernel refuses
the real one. The change is undone from apt's cache and the node rebooted into OLD_DRIVER."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory
from tests.integration.driver_repository import DRIVER_PACKAGES, PERSISTENCED_VERSION, build_repository
from tests.integration.gpu_state import boot_unit
from tests.integration.summary import summary_rows
from tests.integration.test_gpu_node_fleet import sh

REPO = Path(__file__).resolve().parents[2]
NODES = ("dl1", "dl2", "dl3")
pytestmark = pytest.mark.fleet

DRIVER = "550.163.01"
PACKAGE_VERSION = f"{DRIVER}-2"
OLD_DRIVER = "550.144.03"
OLD_PACKAGE_VERSION = f"{OLD_DRIVER}-1"
APT_REPOSITORY = "/srv/gpunode-test-repo"
SOURCE_LIST = "/etc/apt/sources.list.d/gpunode-test.list"
PLANTED = "/root/gpunode-planted"

HOOK = """#!{python}
import json, subprocess, sys, time
which, node = sys.argv[1], sys.argv[2]
record = {{"t": time.time(), "which": which, "node": node}}
if which == "before":
    def ssh(host, command):
        return subprocess.run(["ssh", "-F", {ssh_config!r}, host, command], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    record["caches"] = {{other: ssh(other, "ls /var/cache/apt/archives").split() for other in {nodes!r}}}
    ssh(node, "mv {repository} {repository}.away")  # the turn can fetch nothing from here on
with open({log!r}, "a") as log:
    log.write(json.dumps(record) + "\\n")
"""


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    # Names of their own: fleets share network namespaces by host name.
    with fleet_factory.lent([HostSpec(name, "trixie") for name in NODES], "download") as booted:
        yield booted


def copy_tree(fleet: Fleet, node: str, source: Path, target: str) -> None:
    tar = subprocess.run(["tar", "-C", str(source), "-c", "."], check=True, capture_output=True)
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), node, f"mkdir -p {target} && tar -C {target} -x"],
        input=tar.stdout, capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def prepare(fleet: Fleet, node: str, repository: Path) -> None:
    """An H100 with module DRIVER loaded (no driver package yet) and the test repository read by apt."""
    files = {"pci/0000:41:00.0/vendor": "0x10de", "pci/0000:41:00.0/class": "0x030200",
             "pci/0000:41:00.0/device": "0x2331", "module/nvidia/version": DRIVER}  # fmt: skip
    script = [f"mkdir -p {PLANTED}/{path.rsplit('/', 1)[0]} && echo {text} > {PLANTED}/{path}"
              for path, text in files.items()]  # fmt: skip
    script += [f"mount --bind {PLANTED}/pci /sys/bus/pci/devices", f"mount --bind {PLANTED}/module /sys/module"]
    sh(fleet, node, " && ".join(script))
    copy_tree(fleet, node, repository, APT_REPOSITORY)
    sh(
        fleet, node,
        f"echo 'deb [trusted=yes] copy:{APT_REPOSITORY} ./' > {SOURCE_LIST} && apt-get update -qq "
        f"-o Dir::Etc::sourcelist={SOURCE_LIST} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0",
    )  # fmt: skip


def deploy(inventory_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, inventory_path, "deploys/gpu_node.py")


def inventory(fleet: Fleet, tmp_path: Path, hook: Path, only: str | None = None, **more: Any) -> Path:
    data = {
        "gpunode_driver_version": DRIVER,
        "gpunode_driver_flavor": "default",
        "gpunode_allow_dkms": True,
        "gpunode_mok_enrolled": True,  # an nspawn host cannot tell its Secure Boot state
        "gpunode_toolkit_source": "installed",
        "gpunode_rollout_before": [str(hook), "before", "{node}"],
        "gpunode_rollout_after": [str(hook), "after", "{node}"],
        "gpunode_hook_timeout": 120,
        **more,
    }
    path = tmp_path / "inventory.py"
    path.write_text(
        "import runpy\n"
        f"data = {data!r}\n"
        f"hosts = [(name, {{**host_data, **data}}) for name, host_data in runpy.run_path({str(fleet.inventory_path)!r})"
        f"['hosts'] if {only!r} in (None, name)]\n"
    )
    return path


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def apt_cache(fleet: Fleet, node: str) -> str:
    """Every file under /var/cache/apt with its size and modification time."""
    return sh(fleet, node, "find /var/cache/apt -printf '%p %s %T@\\n' | sort")


def test_driver_packages_are_downloaded_before_the_first_turn_and_the_turn_downloads_nothing(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.reset(NODES)
    kernel = sh(fleet, "dl1", "uname -r").strip()
    repository = build_repository(tmp_path / "build", kernel)
    for node in NODES:
        prepare(fleet, node, repository)
    sh(fleet, "dl3", f"rm {APT_REPOSITORY}/*.deb")  # its index lists them; fetching them fails
    log = tmp_path / "hooks.jsonl"
    hook = tmp_path / "hook"
    hook.write_text(
        HOOK.format(
            python=sys.executable,
            ssh_config=str(fleet.ssh_config_path),
            nodes=list(NODES),
            repository=APT_REPOSITORY,
            log=str(log),
        )
    )
    hook.chmod(0o755)
    path = inventory(fleet, tmp_path, hook)
    pins = (
        f"firmware-nvidia-gsp={PACKAGE_VERSION}, libcuda1={PACKAGE_VERSION}, linux-headers-{kernel}, "
        f"nvidia-driver={PACKAGE_VERSION}, nvidia-kernel-dkms={PACKAGE_VERSION}, "
        f"nvidia-persistenced={PERSISTENCED_VERSION}, nvidia-smi={PACKAGE_VERSION}"
    )
    caches = {node: apt_cache(fleet, node) for node in NODES}

    dry = deploy(path, "--dry")
    assert dry.returncode == 0, dry.stdout
    assert f"[dl1] plan: download before the turns: {pins} (7 files, " in dry.stdout, dry.stdout
    assert "; the turn installs without downloading" in dry.stdout
    assert {node: apt_cache(fleet, node) for node in NODES} == caches, "a dry run wrote under /var/cache/apt"
    assert calls(log) == []

    run = deploy(path, "-y")
    assert run.returncode != 0, run.stdout  # dl3 failed
    made = calls(log)
    assert [(call["which"], call["node"]) for call in made] == [
        ("before", "dl1"), ("after", "dl1"), ("before", "dl2"), ("after", "dl2")
    ], made  # fmt: skip
    # At the first turn's before-hook both nodes that take a turn hold every package in apt's cache.
    debs = sorted(
        [
            f"{name}_{PACKAGE_VERSION}_amd64.deb"
            for name in ("firmware-nvidia-gsp", "libcuda1", "nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi")
        ]
        + [f"linux-headers-{kernel}_1_amd64.deb", f"nvidia-persistenced_{PERSISTENCED_VERSION}_amd64.deb"]
    )
    for node in ("dl1", "dl2"):
        assert sorted(f for f in made[0]["caches"][node] if f.endswith(".deb")) == debs, made[0]["caches"]
    # The turns installed with the repository gone: from the cache, downloading nothing.
    for node in ("dl1", "dl2"):
        assert sh(fleet, node, f"test -d {APT_REPOSITORY}.away && ! test -e {APT_REPOSITORY} && echo gone") == "gone\n"
        assert sh(fleet, node, "dpkg-query -W -f='${Status} ${Version}' nvidia-driver") == (
            f"hold ok installed {PACKAGE_VERSION}"
        )
    rows = summary_rows(run.stdout)
    assert rows["dl1"].startswith("dl1 done: before-hook, driver: install"), rows["dl1"]
    # dl3: failed by its download, named in the summary; it took no turn and nothing was installed.
    reason = "not reached (failed before the rollout, at NVIDIA driver: packages downloaded before the turns: "
    assert reason in rows["dl3"], rows["dl3"]
    assert "packages not downloaded: E: Failed to fetch copy:" in rows["dl3"], rows["dl3"]
    assert sh(fleet, "dl3", "dpkg-query -W -f='${Status}' nvidia-driver 2>/dev/null || true") == ""


# At every boot: the GPU shown, no EFI (Secure Boot off), and the module `modprobe nvidia` would load shown as
# loaded unless its version is listed in REFUSED; each boot's id appended to BOOTS.
REFUSED = f"{PLANTED}/refused"
BOOTS = f"{PLANTED}/boots"
BOOT_SCRIPT = f"""set -e
cat /proc/sys/kernel/random/boot_id >> {BOOTS}
rm -rf {PLANTED}/module && mkdir -p {PLANTED}/module {PLANTED}/firmware
version=$(modinfo -F version nvidia 2>/dev/null || true)
if [ -n "$version" ] && ! grep -qxF "$version" {REFUSED}; then
    mkdir {PLANTED}/module/nvidia && echo "$version" > {PLANTED}/module/nvidia/version
fi
mount --bind {PLANTED}/pci /sys/bus/pci/devices
mount --bind {PLANTED}/module /sys/module
mount --bind {PLANTED}/firmware /sys/firmware
"""
BOOT_UNIT = boot_unit(
    "test: the GPU, and the nvidia module unless the kernel refuses it",
    f"{PLANTED}/boot.sh",
    before="ssh.service containerd.service",
)


def put(fleet: Fleet, node: str, path: str, text: str) -> None:
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), node, f"cat > {path}"],
        input=text, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_driver_change_that_does_not_load_after_its_reboot_is_put_back_from_the_cache(
    fleet: Fleet, tmp_path: Path
) -> None:
    node = "dl1"
    fleet.reset(NODES)
    kernel = sh(fleet, node, "uname -r").strip()
    repository = build_repository(tmp_path / "build", kernel, (OLD_PACKAGE_VERSION, PACKAGE_VERSION), modules=True)
    prepare(fleet, node, repository)
    # as the driver step installs driver OLD_DRIVER: its packages and nvidia-persistenced (of another version), held
    old_set = {**{name: OLD_PACKAGE_VERSION for name in DRIVER_PACKAGES}, "nvidia-persistenced": PERSISTENCED_VERSION}
    old_pins = [f"{name}={version}" for name, version in sorted(old_set.items())]
    sh(fleet, node, f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q {' '.join(old_pins)} >/dev/null "
                    f"&& apt-mark hold {' '.join(old_set)} >/dev/null && apt-get clean")  # fmt: skip
    sh(fleet, node, f"umount /sys/module && echo {DRIVER} > {REFUSED}")
    put(fleet, node, f"{PLANTED}/boot.sh", BOOT_SCRIPT)
    put(fleet, node, "/etc/systemd/system/gpunode-test-gpu.service", BOOT_UNIT)
    sh(fleet, node, f"systemctl enable -q gpunode-test-gpu.service && sh {PLANTED}/boot.sh")
    assert sh(fleet, node, "cat /sys/module/nvidia/version") == f"{OLD_DRIVER}\n"
    log = tmp_path / "hooks.jsonl"
    hook = tmp_path / "hook"
    hook.write_text(HOOK.format(python=sys.executable, ssh_config=str(fleet.ssh_config_path), nodes=[node],
                                repository=APT_REPOSITORY, log=str(log)))  # fmt: skip
    hook.chmod(0o755)
    path = inventory(fleet, tmp_path, hook, gpunode_reboot=True, only=node)

    dry = deploy(path, "--dry")
    assert dry.returncode == 0, dry.stdout
    kept = f"[{node}] plan: download before the turns, to put back where the change fails: driver {OLD_DRIVER}'s "
    assert kept + f"packages {', '.join(old_pins)} (6 files, " in dry.stdout, dry.stdout
    assert (
        f"[{node}] plan: driver: reboot ({OLD_DRIVER} loaded, {DRIVER} installed); driver {OLD_DRIVER} put back where "
        "it does not load"
    ) in dry.stdout, dry.stdout
    assert calls(log) == [] and sh(fleet, node, "ls /var/cache/apt/archives/*.deb 2>/dev/null || true") == ""

    run = deploy(path, "-y")
    assert run.returncode != 0, run.stdout
    # the replaced driver's files were in the cache before the turn; the turn fetched nothing (its repository gone)
    before = [call for call in calls(log) if call["which"] == "before"]
    assert len(before) == 1 and f"nvidia-driver_{OLD_PACKAGE_VERSION}_amd64.deb" in before[0]["caches"][node]
    assert [call["which"] for call in calls(log)] == ["before"], "the after-hook ran for a failed turn"
    row = summary_rows(run.stdout)[node]
    assert (
        f"after the reboot the loaded NVIDIA module is none (userspace none), not {DRIVER}; driver {OLD_DRIVER} put "
        "back: it is loaded, its packages held"
    ) in row, row
    # rebooted into the new driver, then into the old one again
    assert len(sh(fleet, node, f"cat {BOOTS}").split()) == 3
    assert sh(fleet, node, "cat /sys/module/nvidia/version") == f"{OLD_DRIVER}\n"
    status = sh(fleet, node, "dpkg-query -W -f='${Package} ${Status} ${Version}\\n' " + " ".join(old_set))
    assert sorted(status.splitlines()) == [
        f"{name} hold ok installed {version}" for name, version in sorted(old_set.items())
    ]
    assert sh(fleet, node, "dpkg --audit") == ""
    assert sh(fleet, node, "modinfo -F version nvidia") == f"{OLD_DRIVER}\n"
