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
