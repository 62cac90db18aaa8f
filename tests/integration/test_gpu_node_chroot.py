"""deploys/gpu_node.py through the pyinfra CLI on Debian roots (``@chroot``) with planted GPU state.

Four kinds of node: no GPU; a GPU without a driver; a GPU whose driver was installed outside the
package manager and is loaded (Debian's real libnvidia-ml, copied in and registered with ldconfig);
the same with another module version loaded (a reboot pending). The dry run gets no host data at
all; the runs write containerd's files without restarting it (a chroot has no running systemd).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.roots import planted_copies
from tests.integration.gpu_state import (
    DRIVER,
    LIBRARY,
    cdi_spec,
    plant_gpu,
    plant_library,
    plant_module,
    plant_toolkit,
    write,
)

REPO = Path(__file__).resolve().parents[2]
OUR_DROPIN = "etc/containerd/gpunode/nvidia-runtime.toml"
NO_RESTART = ("--data", "gpunode_containerd_restart=none")
pytestmark = pytest.mark.chroot


def no_gpu(root: Path) -> None:
    """Nothing planted: a CPU node."""


def gpu_without_driver(root: Path) -> None:
    plant_gpu(root / "sys/bus/pci/devices")


def preinstalled(root: Path, loaded: str = DRIVER) -> None:
    plant_gpu(root / "sys/bus/pci/devices")
    plant_module(root / "sys/module", root / "proc/driver", loaded)
    plant_library(root)
    plant_toolkit(root)
    write(root, "/etc/cdi/nvidia.yaml", cdi_spec())


def reboot_pending(root: Path) -> None:
    preinstalled(root, loaded="550.144.03")


NODES: dict[str, Callable[[Path], None]] = {
    "cpu": no_gpu, "bare": gpu_without_driver, "pre": preinstalled, "reboot": reboot_pending,
}  # fmt: skip


@pytest.fixture
def roots(trixie_root: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """One writable overlay of the trixie root per kind of node, its GPU state planted."""
    with planted_copies(trixie_root, tmp_path, NODES) as copies:
        yield copies


def pyinfra(hosts: list[Path], *args: str, deploy: str = "deploys/gpu_node.py") -> subprocess.CompletedProcess[str]:
    """The CLI on the roots (an inventory of host names only); stdout carries its log. Run beside the
    roots, not in the checkout, where a failing run would leave its ``pyinfra-debug.log``."""
    inventory = ",".join(f"@chroot/{root}" for root in hosts)
    return cli.pyinfra(*args, inventory, REPO / deploy, cwd=hosts[0].parent.parent)


def said(out: str, root: Path, text: str) -> bool:
    """Whether the log has ``text`` on the root's own line (pyinfra pads the host prefixes)."""
    return re.search(re.escape(f"[@chroot/{root}]") + r"\s+" + re.escape(text), out) is not None


def sh(root: Path, command: str) -> str:
    done = subprocess.run(["chroot", str(root), "sh", "-c", command], capture_output=True, text=True, check=True)
    return done.stdout


def digest(root: Path) -> str:
    """One hash over the paths and contents of the root's /etc and dpkg status."""
    return sh(root, "find /etc /var/lib/dpkg/status -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum")


def driver_packages(root: Path) -> str:
    return sh(root, "dpkg-query -W -f='${Package}\\n' 'nvidia*' 'libnvidia*' 2>/dev/null || true")


def test_dry_run_without_host_data_plans_every_kind_of_node(roots: dict[str, Path]) -> None:
    before = {name: digest(root) for name, root in roots.items()}
    result = pyinfra(list(roots.values()), "--dry")
    out = result.stdout
    assert result.returncode == 0, out
    assert "Traceback" not in out
    assert said(out, roots["cpu"], "no NVIDIA GPU: driver, Fabric Manager, toolkit and CDI steps skipped")
    assert said(
        out, roots["bare"],
        "plan: NVIDIA driver: no NVIDIA driver is loaded and none is asked for: set gpunode_driver_branch "
        "(e.g. 580) or gpunode_driver_version to install one from packages, or load a driver on the node "
        "first and keep gpunode_driver_source at auto",
    )  # fmt: skip
    assert said(out, roots["pre"], f"plan: driver {DRIVER} (proprietary) preinstalled\n")
    assert said(
        out, roots["reboot"],
        f"plan: driver 550.144.03 (proprietary) preinstalled; its userspace library is {DRIVER}: reboot pending",
    )  # fmt: skip
    for root in roots.values():  # every node reaches the containerd step, which plans for it
        assert re.search(re.escape(f"[@chroot/{root}]") + r"\s+plan: .*containerd", out), root
    assert {name: digest(root) for name, root in roots.items()} == before, "a dry run changed a node"


def test_preinstalled_driver_run_installs_no_driver_package(roots: dict[str, Path]) -> None:
    root = roots["pre"]
    result = pyinfra([root], "-y", "-v", *NO_RESTART)
    out = result.stdout
    assert result.returncode == 0, out
    assert f"noop: driver {DRIVER} (proprietary) preinstalled" in out
    assert "noop: NVIDIA Container Toolkit 1.17.8 is installed outside the package manager: " \
           "/usr/local/bin/nvidia-ctk, /usr/local/bin/nvidia-container-runtime" in out  # fmt: skip
    assert "CDI spec" in out and "nvidia-ctk cdi generate" not in out
    assert driver_packages(root) == ""
    assert "nvidia" not in sh(root, "apt-mark showhold")
    assert "nvidia" in sh(root, "containerd config dump")
    assert (root / OUR_DROPIN).is_file()
    assert sh(root, "readlink -f $(ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF}')").strip() == LIBRARY


def test_gpu_without_driver_fails_with_the_keys_to_set(roots: dict[str, Path]) -> None:
    root = roots["bare"]
    result = pyinfra([root], "-y", *NO_RESTART)
    out = result.stdout
    assert result.returncode != 0, out
    assert "Traceback" not in out
    assert "no NVIDIA driver is loaded and none is asked for: set gpunode_driver_branch" in out
    assert not (root / OUR_DROPIN).exists(), "the failed node went on to containerd"
    assert driver_packages(root) == ""


def test_reboot_pending_skips_toolkit_and_cdi_but_registers_the_runtime(roots: dict[str, Path]) -> None:
    root = roots["reboot"]
    (root / "etc/cdi/nvidia.yaml").unlink()  # a CDI step that ran would have to generate it
    result = pyinfra([root], "-y", *NO_RESTART)
    out = result.stdout
    assert result.returncode == 0, out
    assert "reboot pending: Fabric Manager, toolkit and CDI steps skipped" in out
    assert not (root / "etc/cdi/nvidia.yaml").exists()
    assert (root / OUR_DROPIN).is_file()
    assert driver_packages(root) == ""


def test_packages_over_a_preinstalled_driver_are_refused_naming_the_library(roots: dict[str, Path]) -> None:
    root = roots["pre"]
    data = ("--data", "gpunode_driver_branch=550", "--data", "gpunode_allow_dkms=true")
    dry = pyinfra([root], "--dry", *data)
    assert dry.returncode == 0, dry.stdout
    assert f"plan: NVIDIA driver: the loaded NVIDIA driver {DRIVER} was not installed from packages " \
           f"({LIBRARY} belongs to no package)" in dry.stdout  # fmt: skip
    run = pyinfra([root], "-y", *data, *NO_RESTART)
    assert run.returncode != 0 and "Traceback" not in run.stdout, run.stdout
    assert f"({LIBRARY} belongs to no package)" in run.stdout
    assert "gpunode_driver_replace_preinstalled: true" in run.stdout
    assert driver_packages(root) == ""
    forced = pyinfra([root], "--dry", *data, "--data", "gpunode_driver_replace_preinstalled=true")
    assert "belongs to no package" not in forced.stdout
    assert "the package index offers no nvidia-driver on branch 550" in forced.stdout  # main only: no non-free


def test_branch_from_the_command_line_is_taken_as_text(roots: dict[str, Path]) -> None:
    """``--data gpunode_driver_branch=580`` arrives as the int 580: planned as branch '580'."""
    result = pyinfra([roots["bare"]], "--dry", "--data", "gpunode_driver_branch=580")
    assert result.returncode == 0, result.stdout
    assert "plan: NVIDIA driver 580: driver branch 580 is not in Debian 13 (it carries: 535, 550)" in result.stdout


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("gpunode_driver_source=runfile", "host-data key 'gpunode_driver_source' must be one of: auto, packages"),
        ("gpunode_driver_version=580", "host-data key 'gpunode_driver_version': version must be a full driver"),
        ("gpunode_toolkit_version=v1.17.8", "host-data key 'gpunode_toolkit_version': version must be a toolkit"),
    ],
)
def test_refused_host_data_fails_the_node_before_any_change(roots: dict[str, Path], data: str, message: str) -> None:
    root = roots["pre"]
    before = digest(root)
    dry = pyinfra([root], "--dry", "--data", data)
    assert dry.returncode == 0, dry.stdout
    assert f"plan: {message}" in dry.stdout and "Traceback" not in dry.stdout
    run = pyinfra([root], "-y", "--data", data, *NO_RESTART)
    assert run.returncode != 0, run.stdout
    assert message in run.stdout and "Traceback" not in run.stdout
    assert digest(root) == before


def test_refused_host_data_in_the_containerd_deploy_fails_the_node_without_a_traceback(roots: dict[str, Path]) -> None:
    root = roots["cpu"]
    before = digest(root)
    data = ("--data", "gpunode_containerd_restart=sometimes")
    run = pyinfra([root], "-y", *data, deploy="deploys/containerd_runtime.py")
    assert run.returncode != 0, run.stdout
    assert "host-data key 'gpunode_containerd_restart' must be one of: rolling, none" in run.stdout
    assert "Traceback" not in run.stdout
    assert digest(root) == before
