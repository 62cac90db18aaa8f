"""A cgroup of its own per nspawn host (nspawn with --keep-unit nests its payload under it).

On a hybrid layout (controllers on v1, an empty cgroup2 at /sys/fs/cgroup/unified) the host joins
the cgroup2 and the ``name=systemd`` hierarchies; on a pure cgroup2 layout the single hierarchy.
"""

from __future__ import annotations

import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "pyinfra-gpunode-fleet"


def host_cgroups(name: str) -> list[Path]:
    unified = CGROUP_ROOT / "unified"
    if (unified / "cgroup.procs").exists():
        return [unified / PARENT / name, CGROUP_ROOT / "systemd" / PARENT / name]
    return [CGROUP_ROOT / PARENT / name]


def create(name: str) -> list[Path]:
    paths = host_cgroups(name)
    for path in paths:
        for _ in range(50):
            try:
                path.mkdir(parents=True, exist_ok=True)
                break
            except FileNotFoundError:  # another session's ``remove`` took the empty parent meanwhile
                time.sleep(0.1)
        else:
            path.mkdir(parents=True, exist_ok=True)
    return paths


def remove(name: str, timeout: float = 10.0) -> None:
    """Remove the host's cgroups depth-first; they may stay busy while the last processes exit."""
    deadline = time.monotonic() + timeout
    for top in host_cgroups(name):
        while top.exists():
            try:
                _rmdir_tree(top)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            top.parent.rmdir()
        except OSError:
            pass  # other hosts still use the parent


def _rmdir_tree(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir():
            _rmdir_tree(child)
    path.rmdir()
