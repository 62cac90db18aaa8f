"""The containerd writer's safety checks through the pyinfra CLI against a Debian trixie root (containerd 1.7).

Each test builds its case in an overlay over the cached root, runs the real deploy (or the
operation) with ``@chroot``, and checks what the node's files look like afterwards.
"""

from __future__ import annotations

import shutil
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
NONE = ("--data", "gpunode_containerd_restart=none")
SECRET = "s3cret-PASS-4242"
AUTH_DROPIN = f"""version = 2

[plugins."io.containerd.grpc.v1.cri".registry.configs."registry.example:5000".auth]
  username = "puller"
  password = "{SECRET}"
"""
pytestmark = pytest.mark.chroot


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A writable trixie root (overlay over the cached one) with containerd 1.7 and no nvidia runtime binary."""
    require_fleet()
    with writable_copy(ensure_root(RootRecipe("trixie")), tmp_path) as merged:
        yield merged


def pyinfra(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(f"@chroot/{root}", *args, merged=False, timeout=300)


def deploy(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return pyinfra(root, "deploys/containerd_runtime.py", *args)


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file (content) and link (target) under the root's /etc/containerd and /etc/k8s."""
    found: dict[str, bytes | str] = {}
    for top in ("etc/containerd", "etc/k8s"):
        base = root / top
        paths = [base, *base.rglob("*")] if base.is_dir() and not base.is_symlink() else [base]
        for path in paths:
            if path.is_symlink():
                found[str(path.relative_to(root))] = str(path.readlink())
            elif path.is_file():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def runtimes(root: Path) -> dict:
    done = subprocess.run(["chroot", str(root), "containerd", "config", "dump"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]


@pytest.mark.parametrize("link", ["config.toml", "directory"])
def test_symlinked_config_is_refused_and_never_written_through(root: Path, link: str) -> None:
    etc = root / "etc"
    (etc / "k8s").mkdir()
    if link == "config.toml":
        (etc / "containerd/config.toml").rename(etc / "k8s/containerd.toml")
        (etc / "containerd/config.toml").symlink_to("/etc/k8s/containerd.toml")
        named = "/etc/containerd/config.toml is a symbolic link to /etc/k8s/containerd.toml"
    else:
        shutil.move(etc / "containerd", etc / "k8s/containerd")  # a copy: overlayfs renames no directories
        (etc / "containerd").symlink_to("/etc/k8s/containerd")
        named = "/etc/containerd is a symbolic link to /etc/k8s/containerd"
    before = tree(root)

    plan = deploy(root, "--dry", *NONE)
    assert tree(root) == before  # the dry run's facts (the staged candidate included) wrote nothing
    assert named in output(plan), output(plan)

    done = deploy(root, "-y", *NONE)
    assert done.returncode != 0
    assert named in output(done)
    assert tree(root) == before


def test_nvidia_as_default_needs_the_runtime_binary(root: Path) -> None:
    before = tree(root)
    default = ("--data", "gpunode_nvidia_default_runtime=true")
    done = deploy(root, "-y", *NONE, *default)
    assert done.returncode != 0
    assert "nvidia runtime binary /usr/bin/nvidia-container-runtime is missing on the node" in output(done)
    assert "gpunode_nvidia_default_runtime" in output(done)
    assert tree(root) == before
    assert runtimes(root).get("default_runtime_name") == "runc"

    binary = root / "usr/bin/nvidia-container-runtime"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    done = deploy(root, "-y", *NONE, *default)
    assert done.returncode == 0, output(done)
    assert runtimes(root)["default_runtime_name"] == "nvidia"


def test_credentials_keep_their_file_mode_and_stay_out_of_the_output(root: Path) -> None:
    config = root / "etc/containerd/config.toml"
    config.chmod(0o600)
    conf_d = root / "etc/containerd/conf.d"
    conf_d.mkdir()
    (conf_d / "50-auth.toml").write_text(AUTH_DROPIN)
    (conf_d / "50-auth.toml").chmod(0o600)

    done = deploy(root, "-y", *NONE)
    assert done.returncode == 0, output(done)
    assert SECRET not in output(done)

    dropin = root / OUR_DROPIN.lstrip("/")
    assert SECRET in dropin.read_text()  # carried: on 1.x our file owns the whole CRI section
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    assert oct(dropin.stat().st_mode & 0o777) == "0o600"
    assert not list(dropin.parent.glob("*.gpunode-new"))


def test_dry_run_plan_shows_no_credential_in_any_toml_form(root: Path) -> None:
    """config.toml with an inline-table password, a multi-line password and an X-Registry-Token header:
    the dry run's plan (a diff of config.toml, its layout kept, and of our file, which carries them on 1.x)
    shows each as ``<redacted>`` and the other keys as they are."""
    secrets = ("inline-PASS-5151", "multi-LINE-6161", "second-LINE-7171", "hdr-TOKEN-8181")
    config = root / "etc/containerd/config.toml"
    config.write_text(  # the registry first: the lines after the imports edit are the diff's context
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n'
        f'  configs = {{ "r.example" = {{ auth = {{ username = "puller", password = "{secrets[0]}" }} }} }}\n'
        f'  mirrors."m.example".auth.password = """\n{secrets[1]}\n{secrets[2]}"""\n'
        '[plugins."io.containerd.grpc.v1.cri".registry.headers]\n'
        f'  X-Registry-Token = ["{secrets[3]}"]\n'
        '[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/usr/lib/cni"\n'
    )
    config.chmod(0o600)
    before = tree(root)

    plan = deploy(root, "--dry", *NONE)
    assert plan.returncode == 0, output(plan)
    assert f"{OUR_DROPIN} (planned, mode 600)" in output(plan), output(plan)
    for secret in secrets:
        assert secret not in plan.stdout and secret not in plan.stderr
    assert (
        '  configs = { "r.example" = { auth = { username = "<redacted>", password = "<redacted>" } } }' in plan.stderr
    )
    assert '  mirrors."m.example".auth.password = "<redacted>"' in plan.stderr
    assert '+X-Registry-Token = "<redacted>"' in plan.stderr  # our file
    assert '+bin_dir = "/usr/lib/cni"' in plan.stderr
    assert tree(root) == before


def test_control_character_in_the_binary_is_named(root: Path) -> None:
    before = tree(root)
    done = pyinfra(root, "-y", "pyinfra_gpunode.operations.containerd.nvidia_runtime", "binary=/usr/bin/nvidia\nx")
    assert done.returncode != 0
    assert "binary '/usr/bin/nvidia<U+000A>x' contains a newline or another control character" in output(done)
    assert "Traceback" not in output(done)
    assert tree(root) == before


def test_non_utf8_dropin_is_named(root: Path) -> None:
    config = root / "etc/containerd/config.toml"
    config.write_text(config.read_text().replace("version = 2\n", 'version = 2\nimports = ["conf.d/*.toml"]\n', 1))
    (root / "etc/containerd/conf.d").mkdir()
    (root / "etc/containerd/conf.d/50-latin1.toml").write_bytes(b"version = 2\n# caf\xe9\n")
    before = tree(root)
    done = deploy(root, "-y", *NONE)
    assert done.returncode != 0
    assert "/etc/containerd/conf.d/50-latin1.toml: invalid TOML: not UTF-8: byte 0xe9 on line 2" in output(done)
    assert "Traceback" not in output(done)
    assert tree(root) == before


def test_config_larger_than_an_argument_is_registered(root: Path) -> None:
    config = root / "etc/containerd/config.toml"
    notes = "".join(f"# operator note {i}: " + "x" * 100 + "\n" for i in range(1400))
    config.write_text(notes + config.read_text())
    done = deploy(root, "-y", *NONE)
    assert done.returncode == 0, output(done)
    assert {"nvidia", "runc"} <= set(runtimes(root)["runtimes"])
    assert config.read_text().startswith(notes)
