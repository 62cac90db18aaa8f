"""The wheel carries the verification suite and its pytest plugin; pytest finds both outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.packaging import InstalledWheel

REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_the_verification_suite(installed_wheel: InstalledWheel, tmp_path: Path) -> None:
    wheel = installed_wheel.wheel
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("plugin", "inventory", "facts", "test_containerd", "test_gpu", "test_host"):
        assert f"pyinfra_gpunode/verify/{module}.py" in names
    scripts = (
        "toolkit-keyring", "containerd-restart", "containerd-restore", "node-lock", "node-unlock", "write-file",
        "platform-restart", "cdi-refresh", "apt-download", "platform-wait",
    )  # fmt: skip
    for script in scripts:
        assert f"pyinfra_gpunode/operations/shell/{script}.sh" in names  # read when the operations load
    assert "pyinfra_gpunode/facts/shell/unit-config.sh" in names  # read when facts.containerd loads
    assert "pyinfra_gpunode/facts/shell/cdi-specs.sh" in names  # read when facts.cdi loads
    assert "pyinfra_gpunode/hook_supervisor.py" in names  # run by file path for every rollout hook
    assert "pyinfra_gpunode/facts/shell/cdi-refresh-units.sh" in names  # read when facts.cdi loads
    assert "pyinfra_gpunode/facts/shell/containerd-platform.sh" in names  # read when facts.platform loads
    assert "pyinfra_gpunode/facts/shell/gpu-operator.sh" in names  # read when facts.operator loads
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert (
        "[pytest11]\ngpunode_verify = pyinfra_gpunode.verify.plugin"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )

    target = installed_wheel.site
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    environment = {**os.environ, "PYTHONPATH": str(target)}
    where = [sys.executable, "-c", "import pyinfra_gpunode.verify.plugin as p; print(p.__file__)"]
    assert subprocess.run(where, cwd=outside, env=environment, capture_output=True, text=True).stdout.startswith(
        f"{target}/pyinfra_gpunode/verify/"
    )
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "pyinfra_gpunode.verify"]
    usage = subprocess.run([*pytest, "--help"], cwd=outside, env=environment, capture_output=True, text=True)
    assert "--inventory=INVENTORY" in usage.stdout and "--gpunode-checks" in usage.stdout, usage.stdout + usage.stderr
    collected = subprocess.run([*pytest, "--co", "-q"], cwd=outside, env=environment, capture_output=True, text=True)
    assert "no tests collected (15 deselected)" in collected.stdout, collected.stdout + collected.stderr
    refused = subprocess.run(
        [*pytest, "--co", "-q", "--inventory", "x.py", "--gpunode-checks=gpu,kernel"],
        cwd=outside, env=environment, capture_output=True, text=True,
    )  # fmt: skip
    assert "--gpunode-checks: unknown kernel (known: containerd, gpu, host)" in refused.stderr, refused.stderr


def test_suite_starts_in_the_checkout_without_test_extras() -> None:
    """pytest loads the repository's own conftest there; it must not need pyinfra-testing."""
    without_extras = (
        "import sys; sys.modules['pyinfra_testing'] = None; import pytest; "
        "sys.exit(pytest.main(['-p', 'no:cacheprovider', '--pyargs', 'pyinfra_gpunode.verify', '--co', '-q']))"
    )
    done = subprocess.run([sys.executable, "-c", without_extras], cwd=REPO, capture_output=True, text=True)
    assert "no tests collected (15 deselected)" in done.stdout, done.stdout + done.stderr
