"""deploys/readiness.py through the pyinfra CLI on Debian roots (``@chroot``) with planted GPU state.

Every root is a GPU node with a loaded module, Debian's real libnvidia-ml outside the package manager,
the toolkit's binaries, a CDI spec in nvidia-ctk's layout, containerd 1.7 with the toolkit's nvidia
drop-in, the GPU Operator validator's markers and a device plugin socket: one root has all of it and
is ready, each other breaks one link. One run covers them all; nothing changes in any root.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from pyinfra_gpunode import shell
from pyinfra_gpunode.facts import nvml as nvml_fact
from pyinfra_gpunode.facts.nvml import NvmlInfo
from pyinfra_gpunode.gpu_queries import NVML_SECONDS, SMI_SECONDS
from tests import cli
from tests.fleet.roots import planted_copies
from tests.integration.gpu_state import (
    DRIVER,
    cdi_spec,
    plant_device_nodes,
    plant_gpu,
    plant_library,
    plant_module,
    plant_toolkit,
    write,
)
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS, toolkit_dropin

REPO = Path(__file__).resolve().parents[2]
RUNTIME = "/usr/local/bin/nvidia-container-runtime"  # where plant_toolkit puts it
MARKERS = ("driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready")
OTHER = "550.144.03"
pytestmark = pytest.mark.chroot


def gpu_node(
    root: Path,
    *,
    loaded: str | None = DRIVER,
    spec_driver: str | None = DRIVER,
    gpus: int = 1,
    nvswitch: bool = False,
    markers: tuple[str, ...] = MARKERS,
    plugin_socket: bool = True,
    dev_nodes: tuple[str, ...] = ("nvidiactl", "nvidia0"),
) -> None:
    for index in range(gpus):
        plant_gpu(root / "sys/bus/pci/devices", address=f"0000:4{index + 1}:00.0")
    if nvswitch:
        write(root / "sys/bus/pci/devices/0000:c7:00.0", "vendor", "0x10de\n")
        write(root / "sys/bus/pci/devices/0000:c7:00.0", "class", "0x068000\n")
        write(root / "sys/bus/pci/devices/0000:c7:00.0", "device", "0x1af1\n")
    if loaded:
        plant_module(root / "sys/module", root / "proc/driver", loaded)
    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    write(root, f"/lib/modules/{kernel}/updates/dkms/nvidia.ko.xz", "")
    plant_library(root)
    plant_toolkit(root)
    plant_device_nodes(root, *dev_nodes)
    if spec_driver:  # 0.7.0: the root's containerd 1.7.24 reads it (1.7.16 or later)
        write(root, "/etc/cdi/nvidia.yaml", cdi_spec(spec_driver, cdi_version="0.7.0"))
    write(root, CONFIG, "version = 2\n" + IMPORTS)
    write(root, f"{CONFD}/99-nvidia.toml", toolkit_dropin())
    for marker in markers:
        write(root, f"/run/nvidia/validations/{marker}", "")
    (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    if plugin_socket:  # bound inside the root: the path from outside is longer than a socket address may be
        bind = "import socket; socket.socket(socket.AF_UNIX).bind('/var/lib/kubelet/device-plugins/nvidia-gpu.sock')"
        subprocess.run(["chroot", str(root), "python3", "-c", bind], check=True)


def with_pynvml(root: Path) -> None:
    """The real pynvml next to the real library: NVML itself answers, and fails without a GPU device."""
    gpu_node(root)
    target = root / "usr/lib/python3/dist-packages"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(pynvml.__file__, target / "pynvml.py")


def with_runtime_spec(root: Path) -> None:
    """A second nvidia spec in /var/run/cdi (written through the root's real /run: /var/run is an
    absolute link), as the toolkit's refresh service writes it."""
    gpu_node(root)
    write(root, "/run/cdi/nvidia.yaml", cdi_spec())


def with_stale_device_plugin_spec(root: Path) -> None:
    """The device plugin's own JSON spec, left from the driver before (the plugin was not restarted)."""
    gpu_node(root)
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.device-plugin.nvidia.com/gpu",
        "devices": [{"name": "GPU-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        "containerEdits": {"mounts": [{"hostPath": f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{OTHER}",
                                       "containerPath": f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{OTHER}"}]},
    }  # fmt: skip
    write(root, "/run/cdi/k8s.device-plugin.nvidia.com-gpu.json", json.dumps(spec))


NEXT_KERNEL = "9.9.9-next-amd64"


def with_next_kernel_unbuilt(root: Path) -> None:
    """Mid-upgrade: /vmlinuz names a kernel the node boots next, with no nvidia module built for it (and the
    validator's toolkit check not passed, so that the node breaks a link of its own)."""
    gpu_node(root, markers=("driver-ready",))
    (root / "vmlinuz").symlink_to(f"boot/vmlinuz-{NEXT_KERNEL}")
    # dpkg's own database names two driver versions among the userspace libraries
    status = root / "var/lib/dpkg/status"
    stanzas = "".join(
        f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: non-free/libs\n"
        f"Maintainer: Debian NVIDIA Maintainers <pkg-nvidia-devel@lists.alioth.debian.org>\nArchitecture: amd64\n"
        f"Version: {version}\nDescription: {name}\n\n"
        for name, version in (("libnvidia-ml1", f"{DRIVER}-2"), ("libcuda1", f"{OTHER}-1"))
    )
    status.write_text(status.read_text().rstrip("\n") + "\n\n" + stanzas)


# name -> (planting, first broken link or None when ready, a part of its cause)
NODES: dict[str, tuple[Callable[[Path], None], str | None, str]] = {
    "ready": (gpu_node, None, ""),
    "not_loaded": (
        lambda root: gpu_node(root, loaded=None), "module",
        f"is installed (userspace {DRIVER}) but not loaded: /sys/module/nvidia/version is absent",
    ),
    "reboot_pending": (
        lambda root: gpu_node(root, loaded=OTHER), "nvml",
        f"reboot pending after an upgrade: the loaded module is {OTHER} but the userspace library is "
        f"libnvidia-ml.so.{DRIVER}",
    ),
    "nvml_error": (with_pynvml, "nvml", f"the nvidia {DRIVER} module is loaded but NVML fails with "),
    "cdi_missing": (lambda root: gpu_node(root, spec_driver=None), "cdi", "no CDI spec of kind nvidia.com/gpu"),
    "cdi_other_driver": (
        lambda root: gpu_node(root, spec_driver=OTHER), "cdi",
        f"/etc/cdi/nvidia.yaml was generated for driver {OTHER} but {DRIVER} is loaded",
    ),
    "cdi_missing_gpu": (
        lambda root: gpu_node(root, gpus=2), "cdi", "lists devices 0, all but the node has 2 GPU(s): 1 missing",
    ),
    "cdi_no_device_node": (
        lambda root: gpu_node(root, dev_nodes=("nvidiactl",)), "cdi_specs",
        "/etc/cdi/nvidia.yaml names device node(s) /dev/nvidia0 that do not exist",
    ),
    "cdi_shadowed": (with_runtime_spec, "cdi_specs", "/etc/cdi/nvidia.yaml defines nvidia.com/gpu=0, shadowed by "
                     "/var/run/cdi/nvidia.yaml (a later directory wins)"),
    "cdi_device_plugin_stale": (
        with_stale_device_plugin_spec, "cdi_specs",
        f"/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json names driver {OTHER} in its paths, but {DRIVER} is "
        "loaded",
    ),
    "nvswitch": (
        lambda root: gpu_node(root, nvswitch=True), "fabric_manager",
        "this NVSwitch node has no nvidia-fabricmanager package",
    ),
    "validator": (
        with_next_kernel_unbuilt, "validator:toolkit-ready",
        "the GPU Operator's validator has not passed its toolkit check on this node",
    ),
    "plugin": (
        lambda root: gpu_node(root, plugin_socket=False), "device_plugin",
        "no NVIDIA device plugin socket in /var/lib/kubelet/device-plugins",
    ),
}  # fmt: skip


@pytest.fixture
def roots(trixie_root: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """One writable overlay of the trixie root per node, its GPU state planted."""
    with planted_copies(trixie_root, tmp_path, {name: plant for name, (plant, _, _) in NODES.items()}) as copies:
        yield copies


@pytest.fixture
def two_roots(trixie_root: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A ready node and one without a device plugin socket, as ``roots`` plants them."""
    plants = {name: NODES[name][0] for name in ("ready", "plugin")}
    with planted_copies(trixie_root, tmp_path, plants) as copies:
        yield copies


def readiness(roots: dict[str, Path], report: Path, *args: str) -> subprocess.CompletedProcess[str]:
    inventory = ",".join(f"@chroot/{root}" for root in roots.values())
    return readiness_of(inventory, report, *args)


def readiness_of(inventory: str, report: Path, *args: str) -> subprocess.CompletedProcess[str]:
    data = [f"gpunode_readiness_json={report}", f"gpunode_nvidia_runtime_binary={RUNTIME}"]
    return cli.pyinfra(*args, *(arg for item in data for arg in ("--data", item)), inventory, "deploys/readiness.py")


def report_status(report: Path) -> int:
    """The exit status ``python -m pyinfra_gpunode.readiness_status`` reads from the report."""
    command = [sys.executable, "-m", "pyinfra_gpunode.readiness_status", str(report)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60).returncode


def without_times(document: dict) -> dict:
    """A report less what differs from run to run: the run's id and times, each node's time of reading."""
    nodes = [{key: value for key, value in node.items() if key != "read_at"} for node in document["nodes"]]
    return {**document, "run": None, "nodes": nodes}


def digest(root: Path) -> str:
    command = "find /etc /var/lib /run -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
    return subprocess.run(["chroot", str(root), "sh", "-c", command], capture_output=True, text=True, check=True).stdout


def test_each_planted_broken_link_is_named_with_its_cause_and_nothing_changes(
    roots: dict[str, Path], tmp_path: Path
) -> None:
    before = {name: digest(root) for name, root in roots.items()}
    run = readiness(roots, tmp_path / "run.json", "-y")
    dry = readiness(roots, tmp_path / "dry.json", "--dry")
    assert {name: digest(root) for name, root in roots.items()} == before, "the report changed a root"

    document = json.loads((tmp_path / "run.json").read_text())
    dry_document = json.loads((tmp_path / "dry.json").read_text())
    assert without_times(document) == without_times(dry_document)
    assert document["run"]["id"] != dry_document["run"]["id"]
    assert document["run"]["complete"] is True and document["run"]["inventory_nodes"] == len(NODES)
    assert all(node["read_at"] >= document["run"]["started"] for node in document["nodes"])
    assert run.returncode != 0 and dry.returncode == 0, run.stdout
    nodes = {node["node"]: node for node in document["nodes"]}
    for name, (_, link, cause) in NODES.items():
        node = nodes[f"@chroot/{roots[name]}"]
        assert node["first_broken"] == link, (name, json.dumps(node, indent=2))
        assert cause in (node["cause"] or ""), (name, node["cause"])
        for found in node["links"]:
            assert f"  {found['state']:<7} {found['id']:<23}  {found['detail']}\n" in run.stdout
    nvml = nodes[f"@chroot/{roots['nvml_error']}"]["cause"].rsplit(" ", 1)[-1]
    assert nvml in ("DriverNotLoaded", "NoPermission", "Unknown"), nvml  # no GPU device in a chroot
    ready = nodes[f"@chroot/{roots['ready']}"]
    assert not any("boots next" in warning for warning in ready["warnings"]), ready["warnings"]
    (next_boot,) = [w for w in nodes[f"@chroot/{roots['validator']}"]["warnings"] if "boots next" in w]
    assert next_boot.startswith("the nvidia module is built for the running kernel ") and next_boot.endswith(
        f"but not for {NEXT_KERNEL}, the kernel this node boots next: after a reboot no nvidia module loads (build "
        f"it for {NEXT_KERNEL}: `dkms autoinstall -k {NEXT_KERNEL}` with its linux-headers installed, or install "
        "the driver's precompiled module package for it)"
    ), next_boot
    assert f"  warning: {next_boot}\n" in run.stdout
    (mixed,) = [w for w in nodes[f"@chroot/{roots['validator']}"]["warnings"] if "userspace libraries" in w]
    assert mixed.startswith(
        f"the NVIDIA userspace libraries are of 2 driver versions ({OTHER}: libcuda1; {DRIVER}: "
    ), mixed
    states = {found["id"]: found["state"] for found in ready["links"]}
    assert states["containerd_running"] == "unknown"  # a chroot has no running daemon
    assert [states[f"validator:{marker}"] for marker in MARKERS] == ["ok"] * 4
    assert ready["versions"]["module"] == ready["versions"]["userspace"] == DRIVER
    assert f"1 of {len(NODES)} nodes ready" in run.stdout
    assert document["summary"]["not_ready_by_first_broken_link"]["cdi_specs"] == [
        f"@chroot/{roots[name]}" for name in ("cdi_no_device_node", "cdi_shadowed", "cdi_device_plugin_stale")
    ]
    assert states["cdi_specs"] == "ok"  # a 0.7.0 spec on containerd 1.7.24
    plugin = nodes[f"@chroot/{roots['cdi_device_plugin_stale']}"]
    assert plugin["fix"].startswith("/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json: restart the NVIDIA device")
    assert document["summary"]["not_ready_by_first_broken_link"]["cdi"] == [
        f"@chroot/{roots[name]}" for name in ("cdi_missing", "cdi_other_driver", "cdi_missing_gpu")
    ]
    assert document["schema"] == 2 and report_status(tmp_path / "run.json") == 1
    assert {failure["node"] for failure in document["failures"]} == {
        node["node"] for node in document["nodes"] if node["state"] == "not_ready"
    }

    # The ready node alone: status 0; with a node that cannot be reached: pyinfra exits 1, the report 2.
    ready_only = readiness_of(f"@chroot/{roots['ready']}", tmp_path / "ready.json", "-y")
    assert ready_only.returncode == 0 and report_status(tmp_path / "ready.json") == 0, ready_only.stdout
    gone = tmp_path / "gone"
    with_gone = readiness_of(f"@chroot/{roots['ready']},@chroot/{gone}", tmp_path / "gone.json", "-y")
    assert with_gone.returncode == 1 and report_status(tmp_path / "gone.json") == 2, with_gone.stdout
    (failure,) = json.loads((tmp_path / "gone.json").read_text())["failures"]
    assert failure["node"] == f"@chroot/{gone}" and failure["state"] == "unreadable"


def test_a_run_that_dies_replaces_the_last_report_with_its_own(two_roots: dict[str, Path], tmp_path: Path) -> None:
    """The controller dies after its deploy began (here: the deploy file raises for the second node): the
    previous report does not stay to be read as current; the run's own is written, not complete, and the
    status says so."""
    report = tmp_path / "report.json"
    ready, other = two_roots["ready"], two_roots["plugin"]
    readiness_of(f"@chroot/{ready}", report, "-y")
    assert report_status(report) == 0
    previous = json.loads(report.read_text())["run"]["id"]
    dies = tmp_path / "dies.py"
    dies.write_text(
        "from pyinfra import host\n"
        "from pyinfra_gpunode.pipelines.readiness import node_readiness_reported\n"
        "node_readiness_reported()\n"
        f"if host.name == {f'@chroot/{other}'!r}:\n"
        "    raise RuntimeError('the controller died')\n"
    )
    died = cli.pyinfra("-y", "--data", f"gpunode_readiness_json={report}", f"@chroot/{ready},@chroot/{other}", dies)
    assert died.returncode != 0, died.stdout
    document = json.loads(report.read_text())
    assert document["run"]["id"] != previous and document["run"]["complete"] is False
    assert document["run"]["inventory_nodes"] == 2 and len(document["nodes"]) == 2
    unread = [node for node in document["nodes"] if node["state"] == "unreadable"]
    assert unread and all(node["error"].startswith("not read: the run ended") for node in unread), document
    assert report_status(report) == 2


HUNG_SMI = "#!/bin/sh\nexec sleep 600\n"
HUNG_NVML = "import time\n\n\nclass NVMLError(Exception):\n    pass\n\n\ndef nvmlInit():\n    time.sleep(600)\n"


def test_a_wedged_gpu_is_named_and_the_other_node_is_reported(two_roots: dict[str, Path], tmp_path: Path) -> None:
    """nvidia-smi that never answers (a stand-in: a wedged GPU hangs it in the kernel) is left behind after its
    time, the node is named wedged, and the run, the other node's report among it, ends."""
    ready, wedged = two_roots["ready"], two_roots["plugin"]
    write(wedged, "/usr/local/bin/nvidia-smi", HUNG_SMI, mode=0o755)
    report = tmp_path / "wedged.json"
    data = [f"gpunode_readiness_json={report}", f"gpunode_nvidia_runtime_binary={RUNTIME}"]
    run = cli.pyinfra(
        "-y", *(arg for item in data for arg in ("--data", item)), f"@chroot/{ready},@chroot/{wedged}",
        "deploys/readiness.py", timeout=180,
    )  # fmt: skip
    nodes = {node["node"]: node for node in json.loads(report.read_text())["nodes"]}
    assert nodes[f"@chroot/{ready}"]["ready"] is True, run.stdout
    found = nodes[f"@chroot/{wedged}"]
    assert found["first_broken"] == "nvml", json.dumps(found, indent=2)
    assert found["cause"].startswith(
        f"nvidia-smi did not answer in time (nvidia-smi {SMI_SECONDS} s, NVML {NVML_SECONDS} s) with module {DRIVER}"
    )
    assert report_status(report) == 1


def test_nvml_that_never_answers_is_left_behind_as_a_timeout(two_roots: dict[str, Path]) -> None:
    """The fact's own program in a GPU node's root, its limit made one second: a pynvml whose init never
    returns (a wedged GPU's NVML) gives the Timeout answer, the query killed."""
    root = two_roots["plugin"]
    site = subprocess.run(
        ["chroot", str(root), "python3", "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    write(root, f"{site}/pynvml.py", HUNG_NVML)
    program = shell.command(shell.script(nvml_fact.NVML_PROGRAM), "gpunode-nvml", "1", nvml_fact.NVML_SNIPPET)
    started = time.monotonic()
    done = subprocess.run(["chroot", str(root), "sh", "-c", program], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 10
    assert NvmlInfo().process(done.stdout.splitlines())["error"] == "Timeout", done.stdout
