"""The newest mtime of containerd's config tree, as ``ContainerdService`` reads it with the node's own find:
a drop-in that is a symlink counts with its target's mtime (an edit through the link) and its own (a link
pointed elsewhere)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pyinfra_gpunode import shell
from pyinfra_gpunode.facts import containerd


def newest(root: Path, main: Path, tmp: Path, skip: str = "") -> float | None:
    """The fact's config mtime from its own program, over ``root`` and ``main`` (systemctl and pgrep stubbed)."""
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("systemctl", "pgrep"):
        (stubs / name).write_text("#!/bin/sh\nexit 1\n")
        (stubs / name).chmod(0o755)
    command = shell.command(containerd._SERVICE, "gpunode-containerd-service", "containerd", skip, str(root), str(main))
    out = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=True,
        env={"PATH": f"{stubs}:{os.environ['PATH']}"},
    )  # fmt: skip
    return containerd.ContainerdService().process(out.stdout.splitlines())["config_mtime"]


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
    assert newest(root, main, tmp_path) == 1000

    os.utime(target, (5000, 5000))  # edited through the link
    assert newest(root, main, tmp_path) == 5000

    os.utime(target, (1000, 1000))
    os.utime(root / "conf.d" / "registry.toml", (7000, 7000), follow_symlinks=False)  # the link replaced
    assert newest(root, main, tmp_path) == 7000


def test_the_file_the_platform_generates_does_not_count(tmp_path: Path) -> None:
    root = tmp_path / "containerd"
    root.mkdir()
    generated, dropin = root / "config.toml", root / "config.toml.d" / "99-nvidia.toml"
    dropin.parent.mkdir()
    generated.write_text("version = 2\n")
    dropin.write_text("version = 2\n")
    os.utime(dropin, (1000, 1000))
    os.utime(generated, (9000, 9000))  # written at each start of the unit
    os.utime(dropin.parent, (1000, 1000))
    os.utime(root, (1000, 1000))
    assert newest(root, root, tmp_path) == 9000
    assert newest(root, root, tmp_path, skip=str(generated)) == 1000


def test_a_containerd_config_command_is_no_daemon_of_the_node(tmp_path: Path) -> None:
    """A short-lived ``containerd config dump`` (another run's read) must not pass for a daemon outside the
    unit, which would fail a turn with the wrong cause; a process named containerd without it still counts.
    Real processes of that name (scripts: the kernel names the process after the file), found by pgrep."""
    fake = tmp_path / "containerd"
    fake.write_text("#!/bin/sh\nwhile :; do sleep 1; done\n")
    fake.chmod(0o755)
    dump = subprocess.Popen([str(fake), "--config", "/etc/containerd/config.toml", "config", "dump"])
    daemon = subprocess.Popen([str(fake), "--config", "/etc/containerd/config.toml"])
    try:
        command = shell.command(containerd._SERVICE, "gpunode-containerd-service", "containerd", "", str(tmp_path))
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        (line,) = [line for line in out.splitlines() if line.startswith("Processes=")]
        pids = {entry.split(":")[0] for entry in line.removeprefix("Processes=").split()}
        assert str(daemon.pid) in pids and str(dump.pid) not in pids, line
    finally:
        for process in (dump, daemon):
            process.kill()
            process.wait()
