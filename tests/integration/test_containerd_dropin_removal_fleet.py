"""A drop-in deleted on a real containerd 1.7 host: the next run drops what it brought, restarts and verifies."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN
from pyinfra_gpunode.containerd_dump import parse_cri_start_log
from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory, Verify
from tests.realbin.scenarios import CONFD, registry, toolkit_dropin

REPO = Path(__file__).resolve().parents[2]
NODE = "dropin1"  # Debian trixie: containerd 1.7.24
TOOLKIT = f"{CONFD}/99-nvidia.toml"
SITE = f"{CONFD}/10-registry.toml"
pytestmark = pytest.mark.fleet


def deploy(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """The pyinfra CLI on ``NODE`` only; stdout carries its log (stderr merged)."""
    return cli.pyinfra("-y", *args, "--limit", NODE, fleet.inventory_path, "deploys/containerd_runtime.py")


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    """A fleet of its own: the test purges and resets its host."""
    with fleet_factory.lent([HostSpec(NODE, "trixie")], "dropin") as booted:
        yield booted


def sh(fleet: Fleet, command: str) -> str:
    result = fleet.run(NODE, command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def main_pid(fleet: Fleet) -> str:
    return sh(fleet, "systemctl show -p MainPID --value containerd").strip()


def loaded_runtimes(fleet: Fleet) -> list[str]:
    """The runtimes the running daemon's CRI plugin started with (its start line in the journal)."""
    journal = sh(
        fleet,
        'journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$(systemctl show -p InvocationID --value containerd)"',
    )
    loaded = parse_cri_start_log(journal.splitlines())
    assert loaded["loaded"], journal
    return sorted(loaded["runtimes"])


def dump(fleet: Fleet) -> dict:
    python = "import json, sys, tomllib; print(json.dumps(tomllib.loads(sys.stdin.read())))"
    return json.loads(sh(fleet, f"containerd config dump | python3 -c {shlex.quote(python)}"))


def test_deleted_toolkit_dropin_is_dropped_restarted_and_verified(fleet: Fleet, verify: Verify) -> None:
    fleet.reset([NODE])
    site = registry() + '\n[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_dir = "/etc/cni/site.d"\n'
    for path, text in ((SITE, site), (TOOLKIT, toolkit_dropin())):
        sh(fleet, f"mkdir -p {CONFD} && printf %s {shlex.quote(text)} > {path}")

    first = deploy(fleet)
    assert first.returncode == 0, first.stdout
    assert loaded_runtimes(fleet) == ["nvidia", "nvidia-cdi", "nvidia-legacy", "runc"]
    assert f'"file": "{TOOLKIT}"' in sh(fleet, f"cat {OUR_DROPIN}")
    pid = main_pid(fleet)

    sh(fleet, f"rm {TOOLKIT}")  # as the toolkit does when it exits
    second = deploy(fleet)
    assert second.returncode == 0, second.stdout
    assert "would be lost" not in second.stdout
    assert "containerd.runtimes.nvidia-cdi.runtime_type" in second.stdout
    assert f"carried from {TOOLKIT}, which was removed" in second.stdout
    assert main_pid(fleet) != pid  # restarted
    assert loaded_runtimes(fleet) == ["nvidia", "runc"]  # what the new daemon's CRI plugin loaded
    cri = dump(fleet)["plugins"]["io.containerd.grpc.v1.cri"]
    assert sorted(cri["containerd"]["runtimes"]) == ["nvidia", "runc"]
    assert cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert cri["registry"]["config_path"] == "/etc/containerd/certs.d"
    assert (cri["cni"]["bin_dir"], cri["cni"]["conf_dir"]) == ("/usr/lib/cni", "/etc/cni/site.d")
    assert TOOLKIT not in sh(fleet, f"cat {OUR_DROPIN}")
    result = verify(fleet, checks="containerd", hosts=[NODE])
    assert result.returncode == 0, result.stdout

    pid = main_pid(fleet)
    third = deploy(fleet)
    assert third.returncode == 0, third.stdout
    assert main_pid(fleet) == pid and "carried from" not in third.stdout


def test_a_drop_written_without_a_restart_is_restarted_into_by_the_next_run(fleet: Fleet) -> None:
    """The drop-in removed, a run with ``restart: none`` writes the smaller config and leaves the daemon
    as it is; the next run restarts it: the runtimes no file defines any more are reported as dropped,
    not as a failed restart."""
    fleet.reset([NODE])
    sh(fleet, f"mkdir -p {CONFD} && printf %s {shlex.quote(toolkit_dropin())} > {TOOLKIT}")
    first = deploy(fleet)
    assert first.returncode == 0, first.stdout
    sh(fleet, f"rm {TOOLKIT}")
    pid = main_pid(fleet)
    files_only = deploy(fleet, "--data", "gpunode_containerd_restart=none")
    assert files_only.returncode == 0, files_only.stdout
    assert main_pid(fleet) == pid and TOOLKIT not in sh(fleet, f"cat {OUR_DROPIN}")

    restarted = deploy(fleet)
    assert restarted.returncode == 0, restarted.stdout
    assert main_pid(fleet) != pid
    assert loaded_runtimes(fleet) == ["nvidia", "runc"]
    assert "the restart drops runtimes nvidia-cdi, nvidia-legacy" in restarted.stdout, restarted.stdout
