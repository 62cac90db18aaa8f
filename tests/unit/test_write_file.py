"""``write_file()``: one command that writes the text from stdin exactly, with its mode, over the old file."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from pyinfra_gpunode.operations._atomic import write_file


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("no trailing newline", "644"),
        ('password = "s3cr3t"\n\n', "600"),
        ("", "644"),
        ("ä\\n $HOME `x`\n" * 9000, "640"),
    ],
)
def test_the_node_gets_exactly_the_text_with_its_mode(tmp_path: Path, text: str, mode: str) -> None:
    dest = tmp_path / "sub dir" / "file.toml"
    dest.parent.mkdir()
    dest.write_text("old")
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    (command,) = write_file(str(dest), text, mode=mode, user=user, group=group)
    stdin = command.connector_arguments["_stdin"]
    assert not text or text.splitlines()[0] not in command.get_raw_value(), "the text went on the command line"

    # pyinfra writes _stdin with a newline at the end of each line
    result = subprocess.run(["sh", "-c", command.get_raw_value()], input=stdin + "\n", capture_output=True, text=True)

    assert result.returncode == 0, result.stderr
    assert dest.read_text() == text
    assert stat.S_IMODE(dest.stat().st_mode) == int(mode, 8)
    assert sorted(path.name for path in dest.parent.iterdir()) == ["file.toml"]


def test_a_directory_at_dest_is_never_written_into(tmp_path: Path) -> None:
    dest = tmp_path / "nvidia-runtime.toml"
    dest.mkdir()
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    (command,) = write_file(str(dest), "version = 2\n", user=user, group=group)
    stdin = command.connector_arguments["_stdin"]

    result = subprocess.run(["sh", "-c", command.get_raw_value()], input=stdin + "\n", capture_output=True, text=True)

    assert result.returncode != 0
    assert dest.is_dir() and list(dest.iterdir()) == []
