"""The restore after a failed restart (shell/containerd-restore.sh) on a Debian root whose
``/etc/containerd`` is a mount point: the tree is put back file by file into it, and what it
cannot put back fails the host, naming the path.

Each command runs in its own private mount namespace (``unshare -m``) where a scratch directory
is bind-mounted at the root's ``etc/containerd`` and the command runs chrooted in the root, so
the backup step and the restore address ``/etc/containerd`` as on a node.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN
from pyinfra_gpunode.operations._atomic import write_file
from pyinfra_gpunode.operations.containerd import _restore, backup_paths
from tests.fleet.plugin import require_fleet
from tests.fleet.roots import RootRecipe, ensure_root, writable_copy

pytestmark = pytest.mark.chroot

HERE = Path(__file__).resolve().parent
MAIN = "/etc/containerd/config.toml"
BACKUP = "/var/lib/pyinfra-gpunode/backup/containerd-20261201T000000.000000Z.tar"
FAILURE = "containerd failed after the restart; restoring the backup failed"
ADM = 4  # the adm group of a Debian root


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A writable trixie root and the directory mounted at its ``/etc/containerd`` (a copy of the root's)."""
    require_fleet()
    with writable_copy(ensure_root(RootRecipe("trixie")), tmp_path / "root") as root:
        mounted = tmp_path / "mounted"
        subprocess.run(["cp", "-a", str(root / "etc/containerd"), str(mounted)], check=True)
        yield root, mounted


def on_node(
    root: Path, mounted: Path, command: str, stdin: str | None = None, also: dict[str, Path] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` chrooted in ``root``, with ``mounted`` bind-mounted at its ``/etc/containerd``
    (checked to be a mount point) and each directory of ``also`` at its path in the root."""
    binds = {"/etc/containerd": mounted, **(also or {})}
    inner = "".join(
        f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(root) + path)} && "
        f"mountpoint -q {shlex.quote(str(root) + path)} && "
        for path, source in binds.items()
    )
    inner += f"exec chroot {shlex.quote(str(root))} sh -c {shlex.quote(command)}"
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


def the_backup_step() -> str:
    """The command ``containerd.config_backed_up`` runs for ``BACKUP`` (its operation fixture)."""
    fixture = HERE.parent / "operations/containerd.config_backed_up/etc_containerd.json"
    (command,) = json.loads(fixture.read_text())["commands"]
    assert BACKUP in command
    return str(command)


def the_write(path: str, text: str) -> tuple[str, str]:
    (command,) = write_file(path, text)
    return command.get_raw_value(), command.connector_arguments["_stdin"] + "\n"


def the_restore() -> str:
    return _restore(BACKUP, backup_paths(MAIN), [MAIN, OUR_DROPIN], FAILURE).get_raw_value()


def tree(directory: Path) -> dict[str, tuple[str, int, int, int, bytes | str]]:
    """Every entry under ``directory``: type, owner, group, mode and content (or link target)."""
    found = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
        content: bytes | str = str(path.readlink()) if kind == "link" else path.read_bytes() if kind == "file" else ""
        found[str(path.relative_to(directory))] = (kind, info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), content)
    return found


def test_restore_puts_the_tree_back_into_a_mounted_config_dir(node: tuple[Path, Path]) -> None:
    root, mounted = node
    config = mounted / "config.toml"
    os.chown(config, 0, ADM)
    config.chmod(0o640)
    (mounted / "conf.d").mkdir(mode=0o750)
    (mounted / "conf.d/10-registry.toml").write_text('version = 2\n# password = "s3cr3t"\n')
    (mounted / "conf.d/10-registry.toml").chmod(0o600)
    (mounted / "certs.d").symlink_to("/srv/certs.d")
    saved = tree(mounted)
    backed_up = on_node(root, mounted, the_backup_step())
    assert backed_up.returncode == 0, backed_up.stderr

    # What the failed turn left: both files written, a stray temp file, a file mode changed.
    for path, text in ((MAIN, "version = 2\nbroken = true\n"), (OUR_DROPIN, "version = 2\n")):
        command, stdin = the_write(path, text)
        written = on_node(root, mounted, command, stdin)
        assert written.returncode == 0, written.stderr
    (mounted / "gpunode/nvidia-runtime.toml.gpunode-new").write_text("half")
    (mounted / "conf.d/10-registry.toml").chmod(0o644)
    assert config.read_text() == "version = 2\nbroken = true\n"

    restored = on_node(root, mounted, the_restore())

    assert restored.returncode == 0, restored.stderr
    assert tree(mounted) == saved
    assert not (mounted / "containerd").exists()
    assert not list(root.glob("etc/.gpunode-restore.*"))
    failed = list((root / "var/lib/pyinfra-gpunode/failed").glob("containerd-*/etc/containerd/config.toml"))
    assert [path.read_text() for path in failed] == ["version = 2\nbroken = true\n"]


def test_restore_that_cannot_put_a_file_back_fails_naming_it(node: tuple[Path, Path]) -> None:
    root, mounted = node
    backed_up = on_node(root, mounted, the_backup_step())
    assert backed_up.returncode == 0, backed_up.stderr
    # A directory now stands where the backup has config.toml; being a mount point, it cannot move.
    (mounted / "config.toml").unlink()
    (mounted / "config.toml").mkdir()
    elsewhere = mounted.parent / "elsewhere"
    elsewhere.mkdir()

    restored = on_node(root, mounted, the_restore(), also={MAIN: elsewhere})

    assert restored.returncode == 1
    message = restored.stderr.splitlines()[-1]
    assert message.startswith(FAILURE + ": ")
    assert f"{MAIN} is not a regular file" in message
    assert sorted(path.name for path in mounted.iterdir()) == ["config.toml"]
