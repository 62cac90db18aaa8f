"""deploys/containerd_runtime.py on real systemd hosts (containerd 1.7 and 2.3), checked by pyinfra_gpunode.verify."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.fleet import Fleet
from tests.fleet.plugin import Verify

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.fleet


def deploy(fleet: Fleet) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra("-y", fleet.inventory_path, "deploys/containerd_runtime.py", merged=False)


def main_pid(fleet: Fleet, name: str) -> str:
    return fleet.run(name, "systemctl show -p MainPID --value containerd").stdout.strip()


def test_deploy_restarts_verifies_and_second_run_changes_nothing(fleet: Fleet, verify: Verify) -> None:
    fleet.reset(["node1", "node2", "node3"])
    first = deploy(fleet)
    assert first.returncode == 0, first.stdout + first.stderr
    result = verify(fleet, checks="containerd")
    assert result.returncode == 0, result.stdout
    assert "FAILED" not in result.stdout

    pids = {name: main_pid(fleet, name) for name in ("node1", "node2", "node3")}
    second = deploy(fleet)
    assert second.returncode == 0, second.stdout + second.stderr
    assert {name: main_pid(fleet, name) for name in pids} == pids
