"""The newest mtime of containerd's config tree, as ``ContainerdService`` reads it with the node's own find:
a drop-in that is a symlink counts with its target's mtime (an edit through the link) and its own (a link
pointed elsewhere)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pyinfra_gpunode.facts import containerd


def newest(root: Path, main: Path) -> float:
    command = containerd._CONFIG_MTIMES.replace(containerd.CONFIG_ROOT, str(root))
    out = subprocess.run(
        ["sh", "-c", f'cfg="$1"; {command} | sort -n | tail -n 1', "mtime", str(main)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(out.stdout)


def test_an_edit_through_a_symlinked_drop_in_counts(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "etc-containerd", tmp_path / "srv"
    (root / "conf.d").mkdir(parents=True)
    elsewhere.mkdir()
    main = root / "config.toml"
    main.write_text("version = 2\n")
    target = elsewhere / "registry.toml"
    target.write_text("version = 2\n")
    (root / "conf.d" / "registry.toml").symlink_to(target)
    for path in (main, target):
        os.utime(path, (1000, 1000))
    os.utime(root / "conf.d" / "registry.toml", (1000, 1000), follow_symlinks=False)
    assert newest(root, main) == 1000

    os.utime(target, (5000, 5000))  # edited through the link
    assert newest(root, main) == 5000

    os.utime(target, (1000, 1000))
    os.utime(root / "conf.d" / "registry.toml", (7000, 7000), follow_symlinks=False)  # the link replaced
    assert newest(root, main) == 7000
