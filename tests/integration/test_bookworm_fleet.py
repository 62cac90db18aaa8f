"""Debian 12 (bookworm) as a node: its own containerd 1.6.20 under systemd, from the plan to a prepared node.

On 1.6 the last file that touches the CRI plugin replaces the whole plugin section: the drop-in must carry the
CRI plugin whole (runc with it), or the plugin fails to load. The real-binary matrix checks the merge with
bookworm's binary; here a booted bookworm host takes the deploy as a user runs it: a plan that changes nothing,
a run that restarts containerd once and verifies its CRI plugin loaded nvidia and runc, the line's end of
support named, and a re-run that reads the node once and changes nothing.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

from pyinfra_gpunode.containerd_dump import parse_cri_start_log
from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory

NODE = "bw1"
ETC_DIGEST = "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    """A bookworm host of its own."""
    with fleet_factory.lent([HostSpec(NODE, "bookworm")], "bookworm") as booted:
        yield booted


def sh(fleet: Fleet, command: str) -> str:
    result = fleet.run(NODE, command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def deploy(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, "--limit", NODE, fleet.inventory_path, "deploys/gpu_node.py")


def loaded(fleet: Fleet) -> dict:
    """The running daemon's CRI plugin as its start line in the journal has it."""
    invocation = sh(fleet, "systemctl show -p InvocationID --value containerd").strip()
    journal = sh(fleet, f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    found = parse_cri_start_log(journal.splitlines())
    assert found["loaded"], journal
    return found


def test_a_bookworm_node_goes_from_plan_to_prepared_node_on_containerd_1_6(fleet: Fleet) -> None:
    fleet.reset([NODE])
    assert sh(fleet, "containerd --version").split()[2].startswith(("1.6.", "v1.6."))
    assert sh(fleet, ". /etc/os-release && echo $VERSION_CODENAME").strip() == "bookworm"
    etc = sh(fleet, ETC_DIGEST)

    dry = deploy(fleet, "--dry")
    assert dry.returncode == 0, dry.stdout
    assert f"[{NODE}] plan: write /etc/containerd/gpunode/nvidia-runtime.toml" in dry.stdout, dry.stdout
    assert "the 1.6 line is past its end of support" in dry.stdout, dry.stdout
    assert sh(fleet, ETC_DIGEST) == etc  # the plan changed nothing

    run = deploy(fleet, "-y")
    assert run.returncode == 0, run.stdout
    cri = loaded(fleet)
    assert {"nvidia", "runc"} <= set(cri["runtimes"]), cri
    assert cri["default_runtime_name"] == "runc", cri  # nvidia is there for a RuntimeClass, not for every pod
    dropin = sh(fleet, "cat /etc/containerd/gpunode/nvidia-runtime.toml")
    assert "runc" in dropin  # 1.6 replaces the CRI section: the drop-in carries runc with nvidia
    invocation = sh(fleet, "systemctl show -p InvocationID --value containerd").strip()

    again = deploy(fleet, "-y", "--debug")
    assert again.returncode == 0, again.stdout
    assert re.findall(rf"Running command on {NODE}: ", again.stdout) == [f"Running command on {NODE}: "]
    assert sh(fleet, "systemctl show -p InvocationID --value containerd").strip() == invocation
