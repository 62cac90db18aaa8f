"""deploys/containerd_runtime.py through the pyinfra CLI against Debian roots (``@chroot``)."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN
from tests import cli
from tests.fleet.plugin import require_fleet
from tests.fleet.roots import RootRecipe, ensure_root, writable_copy

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.chroot


@pytest.fixture(params=["trixie", "sid"])
def chroot(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A writable Debian root (overlay over the cached one) with containerd installed."""
    require_fleet()
    with writable_copy(ensure_root(RootRecipe(request.param)), tmp_path) as merged:
        yield merged


def pyinfra(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(f"@chroot/{root}", "deploys/containerd_runtime.py", *args, merged=False, timeout=300)


def dump(root: Path) -> dict:
    done = subprocess.run(
        ["chroot", str(root), "containerd", "config", "dump"], capture_output=True, text=True, check=True
    )
    return tomllib.loads(done.stdout)


def runtimes(root: Path) -> set[str]:
    data = dump(root)
    plugin = "io.containerd.cri.v1.runtime" if data["version"] == 3 else "io.containerd.grpc.v1.cri"
    return set(data["plugins"][plugin]["containerd"]["runtimes"])


def test_deploy_registers_runtime_then_changes_nothing(chroot: Path) -> None:
    assert "nvidia" not in runtimes(chroot)
    first = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=none")
    assert first.returncode == 0, first.stdout + first.stderr
    assert {"nvidia", "runc"} <= runtimes(chroot)
    written = (chroot / OUR_DROPIN.lstrip("/")).stat()
    assert oct(written.st_mode & 0o777) == "0o644" and written.st_uid == 0
    assert not list((chroot / "etc/containerd").rglob("*.gpunode-new"))

    plan = pyinfra(chroot, "--dry", "--json", "--data", "gpunode_containerd_restart=none")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    changes = [op for op in json.loads(plan.stdout[plan.stdout.index("{") :])["plan"] if op["hosts_with_change"]]
    assert changes == []

    second = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=none")
    assert second.returncode == 0
    assert (chroot / OUR_DROPIN.lstrip("/")).stat().st_mtime == written.st_mtime


def test_bad_host_data_is_refused_before_any_change(chroot: Path) -> None:
    before = (chroot / "etc/containerd/config.toml").read_text()
    done = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=sometimes")
    assert done.returncode != 0
    assert "gpunode_containerd_restart" in done.stdout + done.stderr
    assert (chroot / "etc/containerd/config.toml").read_text() == before
    assert not (chroot / OUR_DROPIN.lstrip("/")).exists()


def test_invalid_dropin_fails_the_host_and_writes_nothing(chroot: Path) -> None:
    conf_d = chroot / "etc/containerd/conf.d"
    conf_d.mkdir(parents=True)
    (conf_d / "50-broken.toml").write_text("this is = = not toml\n")
    before = (chroot / "etc/containerd/config.toml").read_text()
    done = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=none")
    assert done.returncode != 0
    assert "/etc/containerd/conf.d/50-broken.toml: invalid TOML" in done.stdout + done.stderr
    assert (chroot / "etc/containerd/config.toml").read_text() == before
    assert not (chroot / OUR_DROPIN.lstrip("/")).exists()


def test_directory_at_our_dropin_path_is_refused_naming_it(chroot: Path) -> None:
    in_the_way = chroot / OUR_DROPIN.lstrip("/")
    in_the_way.mkdir(parents=True)
    config = chroot / "etc/containerd/config.toml"
    before = config.read_text()
    message = f"{OUR_DROPIN} is a directory, not a regular file"

    plan = pyinfra(chroot, "--dry", "--data", "gpunode_containerd_restart=none")
    assert message in plan.stdout + plan.stderr
    for _ in range(2):
        done = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=none")
        assert done.returncode != 0
        assert message in done.stdout + done.stderr

    assert in_the_way.is_dir() and not list(in_the_way.iterdir())
    assert config.read_text() == before
    assert not list((chroot / "etc/containerd").rglob("*.gpunode-new"))


def test_written_files_keep_owner_group_and_mode(chroot: Path) -> None:
    adm = 4  # a group of every Debian root
    config = chroot / "etc/containerd/config.toml"
    os.chown(config, 0, adm)
    config.chmod(0o640)
    first = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=none")
    assert first.returncode == 0, first.stdout + first.stderr
    assert OUR_DROPIN in config.read_text()
    written = config.stat()
    assert (written.st_uid, written.st_gid, oct(written.st_mode & 0o777)) == (0, adm, "0o640")

    dropin = chroot / OUR_DROPIN.lstrip("/")
    os.chown(dropin, 0, adm)
    dropin.chmod(0o600)  # stricter than config.toml, whose keys it carries: kept
    dropin.write_text(dropin.read_text() + "# changed by hand\n")
    second = pyinfra(chroot, "-y", "--data", "gpunode_containerd_restart=none")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "# changed by hand" not in dropin.read_text()
    rewritten = dropin.stat()
    assert (rewritten.st_uid, rewritten.st_gid, oct(rewritten.st_mode & 0o777)) == (0, adm, "0o600")
