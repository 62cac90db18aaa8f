"""NRI mode (``gpunode_containerd_mode: nri``): deploys/containerd_runtime.py through the pyinfra CLI against
Debian roots, judged by the root's own ``containerd config dump``.

trixie carries containerd 1.7.24 (NRI off by default), sid 2.1.9 (NRI on by default). Each case runs in an
overlay over the cached root with ``gpunode_containerd_restart: none``.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.containerd_dropin import NRI, OUR_DROPIN
from tests import cli
from tests.fleet.plugin import require_fleet
from tests.fleet.roots import RootRecipe, ensure_root, writable_copy

REPO = Path(__file__).resolve().parents[2]
NRI_MODE = ("--data", "gpunode_containerd_mode=nri", "--data", "gpunode_containerd_restart=none")
CONFIG = "etc/containerd/config.toml"
SITE_NRI = "etc/containerd/conf.d/50-nri.toml"
MODE_LINE = "NRI mode: no nvidia runtime registered; NRI and CDI enabled, for the GPU Operator's NRI plugin"
pytestmark = pytest.mark.chroot


@pytest.fixture(params=["trixie", "sid"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    require_fleet()
    with writable_copy(ensure_root(RootRecipe(request.param)), tmp_path) as merged:
        yield merged


def deploy(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(f"@chroot/{root}", "deploys/containerd_runtime.py", *args, merged=False, timeout=300)


def output(done: subprocess.CompletedProcess[str]) -> str:
    return f"rc={done.returncode}\n{done.stdout}{done.stderr}"


def dump(root: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["chroot", str(root), "containerd", "config", "dump"], capture_output=True, text=True, check=True
    )
    return tomllib.loads(done.stdout)


def runtime_table(merged: dict[str, Any]) -> dict[str, Any]:
    plugin = "io.containerd.cri.v1.runtime" if merged["version"] == 3 else "io.containerd.grpc.v1.cri"
    table: dict[str, Any] = merged["plugins"][plugin]
    return table


def nri_table(merged: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = merged["plugins"][NRI]
    return table


def assert_nri_mode(merged: dict[str, Any]) -> None:
    """NRI on, CDI on, no nvidia runtime, runc still there: what the GPU Operator's NRI plugin needs."""
    assert nri_table(merged)["disable"] is False
    assert NRI not in merged.get("disabled_plugins", [])
    cri = runtime_table(merged)
    assert cri["enable_cdi"] is True
    assert "nvidia" not in cri["containerd"]["runtimes"]
    assert "runc" in cri["containerd"]["runtimes"]


def planned_changes(root: Path, *args: str) -> list[dict[str, Any]]:
    plan = deploy(root, "--dry", "--json", *args)
    assert plan.returncode == 0, output(plan)
    return [op for op in json.loads(plan.stdout[plan.stdout.index("{") :])["plan"] if op["hosts_with_change"]]


def plant_nri_file(root: Path, text: str) -> None:
    config = root / CONFIG
    config.write_text(
        config.read_text().replace("version = 2\n", 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n', 1)
    )
    (root / SITE_NRI).parent.mkdir(parents=True, exist_ok=True)
    (root / SITE_NRI).write_text(f'version = 2\n\n[plugins."{NRI}"]\n{text}')


def test_nri_mode_turns_on_nri_and_cdi_without_a_runtime_then_changes_nothing(root: Path) -> None:
    first = deploy(root, "-y", *NRI_MODE)
    assert first.returncode == 0, output(first)
    assert MODE_LINE in output(first)
    assert_nri_mode(dump(root))
    dropin = root / OUR_DROPIN.lstrip("/")
    written = dropin.stat()
    assert "runtimes.nvidia" not in dropin.read_text()

    assert planned_changes(root, *NRI_MODE) == []
    second = deploy(root, "-y", *NRI_MODE)
    assert second.returncode == 0, output(second)
    assert dropin.stat().st_mtime == written.st_mtime
    assert_nri_mode(dump(root))


def test_switch_from_runtime_mode_drops_our_runtime_and_says_so(root: Path) -> None:
    registered = deploy(root, "-y", "--data", "gpunode_containerd_restart=none")
    assert registered.returncode == 0, output(registered)
    assert "nvidia" in runtime_table(dump(root))["containerd"]["runtimes"]

    plan = deploy(root, "--dry", *NRI_MODE)
    assert f"dropped runtime nvidia registered by {OUR_DROPIN}: NRI mode registers no runtime" in output(plan)
    switched = deploy(root, "-y", *NRI_MODE)
    assert switched.returncode == 0, output(switched)
    assert_nri_mode(dump(root))
    assert planned_changes(root, *NRI_MODE) == []


def test_a_file_turning_nri_off_is_kept_and_named_unless_asked(root: Path) -> None:
    socket = "/run/nri/site.sock"
    plant_nri_file(root, f'  disable = true\n  socket_path = "{socket}"\n')

    plan = output(deploy(root, "--dry", *NRI_MODE))
    assert f"NRI stays off: /{SITE_NRI} sets disable = true; kept" in plan, plan
    assert "NRI mode: no nvidia runtime registered; NRI stays off, CDI enabled as the files set it" in plan
    kept = deploy(root, "-y", *NRI_MODE)
    assert kept.returncode == 0, output(kept)
    merged = dump(root)
    assert nri_table(merged)["disable"] is True
    assert nri_table(merged)["socket_path"] == socket
    assert runtime_table(merged)["enable_cdi"] is True
    assert "nvidia" not in runtime_table(merged)["containerd"]["runtimes"]
    assert planned_changes(root, *NRI_MODE) == []

    asking = (*NRI_MODE, "--data", "gpunode_enable_nri=true")
    plan = output(deploy(root, "--dry", *asking))
    assert f"NRI on: disable = false (gpunode_enable_nri); /{SITE_NRI} sets true" in plan, plan
    asked = deploy(root, "-y", *asking)
    assert asked.returncode == 0, output(asked)
    merged = dump(root)
    assert_nri_mode(merged)
    assert nri_table(merged)["socket_path"] == socket  # the file's other NRI keys kept (carried on 1.7)
