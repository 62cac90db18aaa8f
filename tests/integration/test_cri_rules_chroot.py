"""A config the CRI plugin would refuse at start is refused before any write: pyinfra CLI, Debian roots.

trixie carries containerd 1.7.24, sid 2.1.9. Each case is built in an overlay over the cached root; the
deploy's output must name the keys and the files, and the node's files stay byte for byte as they were.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.plugin import require_fleet
from tests.fleet.roots import RootRecipe, ensure_root, writable_copy

REPO = Path(__file__).resolve().parents[2]
NONE = ("--data", "gpunode_containerd_restart=none")
CONFIG = "etc/containerd/config.toml"
CERTS = "etc/containerd/conf.d/50-certs.toml"
DROPIN = "etc/containerd/gpunode/nvidia-runtime.toml"
pytestmark = pytest.mark.chroot


@pytest.fixture(params=["trixie", "sid"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    require_fleet()
    with writable_copy(ensure_root(RootRecipe(request.param)), tmp_path) as merged:
        yield merged


def plugins(root: Path) -> tuple[int, str]:
    """The config version and CRI images plugin name for the root's containerd."""
    done = subprocess.run(["chroot", str(root), "containerd", "--version"], capture_output=True, text=True, check=True)
    return (3, "io.containerd.cri.v1.images") if " 2." in done.stdout else (2, "io.containerd.grpc.v1.cri")


def deploy(root: Path, *args: str) -> str:
    done = cli.pyinfra(f"@chroot/{root}", "deploys/containerd_runtime.py", *args, *NONE, merged=False, timeout=300)
    return f"rc={done.returncode}\n{done.stdout}{done.stderr}"


def tree(root: Path) -> dict[str, bytes]:
    base = root / "etc/containerd"
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(base.rglob("*")) if path.is_file()}


def test_mirrors_with_config_path_is_refused_naming_keys_and_files(root: Path) -> None:
    schema, images = plugins(root)
    (root / CONFIG).write_text(
        f'version = {schema}\nimports = ["/etc/containerd/conf.d/*.toml"]\n\n'
        f'[plugins."{images}".registry.mirrors."docker.io"]\n  endpoint = ["https://mirror.example"]\n'
    )
    (root / CERTS).parent.mkdir(parents=True, exist_ok=True)
    (root / CERTS).write_text(
        f'version = {schema}\n[plugins."{images}".registry]\n  config_path = "/etc/containerd/certs.d"\n'
    )
    before = tree(root)

    plan = deploy(root, "--dry")
    assert tree(root) == before
    assert "`mirrors` cannot be set when `config_path` is provided" in plan, plan

    done = deploy(root, "-y")
    assert not done.startswith("rc=0"), done
    assert "by the CRI plugin's start rules, the candidate config:" in done
    assert f'plugins."{images}".registry.mirrors (docker.io; in /{CONFIG}' in done, done
    assert f"(in /{CERTS}" in done, done
    assert tree(root) == before


def test_disabled_cri_plugin_is_named_instead_of_missing_runtimes(root: Path) -> None:
    schema, _images = plugins(root)
    (root / CONFIG).write_text(f'version = {schema}\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
    before = tree(root)
    done = deploy(root, "-y")
    assert not done.startswith("rc=0"), done
    assert f"/{CONFIG}: the CRI plugin is disabled (disabled_plugins names io.containerd.grpc.v1.cri)" in done, done
    assert "runtime nvidia is missing" not in done
    assert "is not defined" not in done
    assert tree(root) == before


def test_an_import_naming_a_missing_file_is_refused_naming_file_key_and_path(root: Path) -> None:
    """containerd exits at start on it (2.x's ``config dump`` does not even say so): refused, nothing written."""
    schema, _images = plugins(root)
    (root / CONFIG).write_text(
        f'version = {schema}\nimports = ["/etc/containerd/conf.d/*.toml", "site/10-site.toml"]\n'
    )
    before = tree(root)
    plan = deploy(root, "--dry")
    assert tree(root) == before
    named = (
        f"/{CONFIG}: key 'imports' entry 'site/10-site.toml' names /etc/containerd/site/10-site.toml, "
        "which does not exist: containerd exits at start"
    )
    assert named in plan, plan
    done = deploy(root, "-y")
    assert not done.startswith("rc=0"), done
    assert named in done, done
    assert tree(root) == before


def test_our_drop_in_named_but_removed_is_written_back(root: Path) -> None:
    """config.toml names our drop-in by path: without it containerd would not start, so a run puts it back.
    (On 1.x the node's dump fails then, so runc's ``sandbox_mode``, which containerd fills in itself, is left
    unwritten: the same config.)"""
    first = deploy(root, "-y")
    assert first.startswith("rc=0"), first
    written = tree(root)
    assert f"/{DROPIN}" in written[CONFIG].decode()
    (root / DROPIN).unlink()
    done = deploy(root, "-y")
    assert done.startswith("rc=0"), done
    again = tree(root)
    assert again[CONFIG] == written[CONFIG]
    filled = '\nsandbox_mode = "podsandbox"\n'
    assert again[DROPIN].decode() == written[DROPIN].decode().replace(filled, "\n")
    dump = subprocess.run(
        ["chroot", str(root), "containerd", "config", "dump"], capture_output=True, text=True, timeout=60
    )
    assert dump.returncode == 0, dump.stderr
    assert deploy(root, "-y").startswith("rc=0")
    assert tree(root) == again  # settled: the next run writes nothing
