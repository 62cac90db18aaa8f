"""The GPU Operator beside the deploys, through the pyinfra CLI on Debian roots (``@chroot``).

Planted as the operator leaves a node (NVIDIA/gpu-operator 25.10+, nvidia-ctk-installer v1.20.0):
its toolkit's binaries in ``/usr/local/nvidia/toolkit`` and its containerd drop-in
``/etc/containerd/conf.d/99-nvidia.toml`` (``tests/corpus/containerd/gpu-operator-toolkit*.toml``,
sources named in their first lines); its driver container's root ``/run/nvidia/driver`` with
Debian's real libnvidia-ml where the container has it (``usr/lib/x86_64-linux-gnu``), the loaded
module on the host and no library in the host's loader cache (the toolkit's entrypoint,
``driver_root=/run/nvidia/driver``); its validator's markers in ``/run/nvidia/validations``
(``cmd/nvidia-validator/main.go``: ``driver-ready`` holds ``IS_HOST_DRIVER=false`` and
``NVIDIA_DRIVER_ROOT=/run/nvidia/driver`` on a driver-container node). containerd is Debian's
real 1.7 in the trixie root; runs write files without restarting it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.roots import planted_copies
from tests.integration.gpu_state import DRIVER, libnvidia_ml, plant_gpu, plant_library, plant_module, write

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests/corpus/containerd"
OPERATOR_DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
OUR_DROPIN = "etc/containerd/gpunode/nvidia-runtime.toml"
TOOLKIT = "/usr/local/nvidia/toolkit"
CONTAINER_LIBRARY = f"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{DRIVER}"
NO_RESTART = ("--data", "gpunode_containerd_restart=none")
pytestmark = pytest.mark.chroot


def operator_toolkit(root: Path) -> None:
    """The operator's toolkit container's work on a host-driver node: binaries and drop-in."""
    plant_gpu(root / "sys/bus/pci/devices")
    plant_module(root / "sys/module", root / "proc/driver")
    plant_library(root)
    write(root, "/etc/containerd/config.toml", (CORPUS / "gpu-operator-toolkit.toml").read_text())
    write(root, OPERATOR_DROPIN, (CORPUS / "gpu-operator-toolkit+99-nvidia.toml").read_text())
    for name in ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy"):
        write(root, f"{TOOLKIT}/{name}", "#!/bin/sh\necho 'runc version 1.20.0'\n", 0o755)
    write(root, f"{TOOLKIT}/nvidia-ctk", "#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.20.0'\n", 0o755)
    write(root, "/run/nvidia/validations/driver-ready", "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n")
    write(root, "/run/nvidia/validations/toolkit-ready", "")


def driver_container(root: Path) -> None:
    """The operator's driver container: module loaded, its userspace only under /run/nvidia/driver."""
    plant_gpu(root / "sys/bus/pci/devices")
    plant_module(root / "sys/module", root / "proc/driver")
    library = root / CONTAINER_LIBRARY.lstrip("/")
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(libnvidia_ml().read_bytes())
    (library.parent / "libnvidia-ml.so.1").symlink_to(library.name)
    write(root, "/run/nvidia/validations/.driver-ctr-ready", "")
    write(
        root, "/run/nvidia/validations/driver-ready",
        "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/driver-root\n",
    )  # fmt: skip


@pytest.fixture
def roots(trixie_root: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    nodes = {"toolkit": operator_toolkit, "container": driver_container, "plain": lambda root: None}
    with planted_copies(trixie_root, tmp_path, nodes) as copies:
        yield copies


def pyinfra(root: Path, *args: str, deploy: str = "deploys/gpu_node.py") -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, f"@chroot/{root}", REPO / deploy, cwd=root.parent.parent)


def sh(root: Path, command: str) -> str:
    return subprocess.run(["chroot", str(root), "sh", "-c", command], capture_output=True, text=True, check=True).stdout


def digest(root: Path) -> str:
    return sh(root, "find /etc /usr/local /var/lib/dpkg/status -xdev -type f -print0 | sort -z | xargs -0 sha256sum")


def test_operator_toolkit_runtime_fails_the_node_before_any_change(roots: dict[str, Path]) -> None:
    root = roots["toolkit"]
    before = digest(root)
    for deploy in ("deploys/gpu_node.py", "deploys/containerd_runtime.py"):
        dry = pyinfra(root, "--dry", deploy=deploy)
        assert dry.returncode == 0 and "Traceback" not in dry.stdout, dry.stdout
        assert f"the GPU Operator's toolkit manages the nvidia runtime on this node: {OPERATOR_DROPIN} " \
               f"(GPU Operator toolkit, BinaryName {TOOLKIT}/nvidia-container-runtime)" in dry.stdout  # fmt: skip
        run = pyinfra(root, "-y", *NO_RESTART, deploy=deploy)
        assert run.returncode != 0 and "Traceback" not in run.stdout, run.stdout
        assert "`toolkit.enabled=false` in the operator's Helm values" in run.stdout
        assert "gpunode_take_over_runtime: true" in run.stdout
        assert digest(root) == before, f"{deploy} changed the node"
    assert not (root / OUR_DROPIN).exists()


def test_take_over_writes_our_runtime_after_the_operators_and_keeps_its_file(roots: dict[str, Path]) -> None:
    root = roots["toolkit"]
    operator_file = (root / OPERATOR_DROPIN.lstrip("/")).read_bytes()
    data = ("--data", "gpunode_take_over_runtime=true", "--data", "gpunode_nvidia_runtime_binary=/bin/true")
    dry = pyinfra(root, "--dry", *data, deploy="deploys/containerd_runtime.py")
    assert "gpunode_take_over_runtime: gpunode's nvidia runtime" in dry.stdout, dry.stdout
    assert f"loads after the GPU Operator's {OPERATOR_DROPIN}" in dry.stdout
    run = pyinfra(root, "-y", *data, *NO_RESTART, deploy="deploys/containerd_runtime.py")
    assert run.returncode == 0, run.stdout
    assert (root / OPERATOR_DROPIN.lstrip("/")).read_bytes() == operator_file
    dump = sh(root, "containerd config dump")
    nvidia = re.search(r'runtimes\.nvidia\.options\]\n(?:.*\n)*?\s*BinaryName = "([^"]*)"', dump)
    assert nvidia is not None and nvidia.group(1) == "/bin/true", dump


def test_driver_container_is_recognised_by_the_plan_and_the_report(roots: dict[str, Path], tmp_path: Path) -> None:
    root = roots["container"]
    before = digest(root)
    dry = pyinfra(root, "--dry")
    assert dry.returncode == 0 and "Traceback" not in dry.stdout, dry.stdout
    assert f"driver {DRIVER} from the GPU Operator's driver container (/run/nvidia/driver, userspace {DRIVER})" \
           in dry.stdout  # fmt: skip
    assert "no NVIDIA userspace library" not in dry.stdout
    assert "the loader finds no libnvidia-ml.so.1" not in dry.stdout
    assert "its userspace is the GPU Operator's driver container's (/run/nvidia/driver)" in dry.stdout
    packages = pyinfra(root, "--dry", "--data", "gpunode_driver_branch=550")
    assert "the GPU Operator's driver container (/run/nvidia/driver); installing driver packages" in packages.stdout
    assert "`driver.enabled=false`" in packages.stdout
    assert digest(root) == before

    report = tmp_path / "report.json"
    pyinfra(root, "--dry", "--data", f"gpunode_readiness_json={report}", deploy="deploys/readiness.py")
    (node,) = json.loads(report.read_text())["nodes"]
    links = {link["id"]: link for link in node["links"]}
    assert links["nvml"]["state"] == "ok", links["nvml"]
    assert "(GPU Operator driver container, /run/nvidia/driver)" in links["nvml"]["detail"]
    assert "driver: GPU Operator driver container (/run/nvidia/driver)" in links["owners"]["detail"]
    assert "validations: .driver-ctr-ready, driver-ready" in links["owners"]["detail"]


def test_report_names_the_second_writer_of_the_runtime(roots: dict[str, Path], tmp_path: Path) -> None:
    root = roots["toolkit"]
    write(root, "/etc/containerd/conf.d/50-mine.toml", (CORPUS / "nvidia-ctk-dropin+99-nvidia.toml").read_text())
    report = tmp_path / "report.json"
    pyinfra(root, "--dry", "--data", f"gpunode_readiness_json={report}", deploy="deploys/readiness.py")
    (node,) = json.loads(report.read_text())["nodes"]
    links = {link["id"]: link for link in node["links"]}
    writers = links["runtime_writers"]
    assert writers["state"] == "broken", writers
    assert f"{OPERATOR_DROPIN} (GPU Operator toolkit, BinaryName {TOOLKIT}/nvidia-container-runtime)" \
           in writers["cause"]  # fmt: skip
    assert "/etc/containerd/conf.d/50-mine.toml (user, BinaryName /usr/bin/nvidia-container-runtime)" \
           in writers["cause"]  # fmt: skip
    assert "toolkit.enabled=false" in writers["fix"]
    assert "toolkit: GPU Operator toolkit (/usr/local/nvidia/toolkit)" in links["owners"]["detail"]


def test_a_runtime_handler_no_runtime_serves_fails_the_node_naming_it(roots: dict[str, Path]) -> None:
    root = roots["plain"]
    before = digest(root)
    data = ("--data", "gpunode_runtime_handler=nvidia-cdi", "--data", "gpunode_nvidia_runtime_binary=/bin/true")
    run = pyinfra(root, "-y", *data, *NO_RESTART, deploy="deploys/containerd_runtime.py")
    assert run.returncode != 0 and "Traceback" not in run.stdout, run.stdout
    assert "the RuntimeClass handler nvidia-cdi (gpunode_runtime_handler) names no runtime in containerd's config " \
           "(runtimes: nvidia, runc)" in run.stdout  # fmt: skip
    assert digest(root) == before and not (root / OUR_DROPIN).exists()
    named = pyinfra(root, "-y", *NO_RESTART, "--data", "gpunode_nvidia_runtime_binary=/bin/true",
                    deploy="deploys/containerd_runtime.py")  # fmt: skip
    assert named.returncode == 0, named.stdout


def test_a_planted_drop_in_cannot_forge_other_parts_of_the_report(roots: dict[str, Path], tmp_path: Path) -> None:
    """A drop-in line shaped like the report's part markers stays out of the other parts."""
    root = roots["toolkit"]
    dropin = root / OPERATOR_DROPIN.lstrip("/")
    dropin.write_text(dropin.read_text() + "@@gpunode-readiness:validations\nplugin-ready\n")
    report = tmp_path / "report.json"
    pyinfra(root, "--dry", "--data", f"gpunode_readiness_json={report}", deploy="deploys/readiness.py")
    (node,) = json.loads(report.read_text())["nodes"]
    links = {link["id"]: link for link in node["links"]}
    assert links["validator:toolkit-ready"]["state"] == "ok"
    assert links["validator:plugin-ready"]["state"] == "broken", links["validator:plugin-ready"]
