"""The shell programs shipped as files (``facts/shell/``, ``operations/shell/``): each is run by the module
beside it, says how it is called, and reaches the node as a whole program; ``shell.command`` quotes every
argument but an ``Expanded`` one."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pyinfra_gpunode import shell

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = sorted([*(REPO / "facts" / "shell").glob("*.sh"), *(REPO / "operations" / "shell").glob("*.sh")])


def test_there_are_programs() -> None:
    assert len(PROGRAMS) >= 30


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda path: f"{path.parent.parent.name}/{path.name}")
def test_each_program_is_run_by_its_package_and_says_how(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# shellcheck shell=sh\n"), path
    assert re.search(r"^# Usage: sh -c \"\$script\" gpunode-", text, re.MULTILINE), f"{path.name} has no usage line"
    modules = "".join(module.read_text() for module in path.parent.parent.glob("*.py"))
    assert f'"{path.name}"' in modules, f"no module beside {path.parent} runs {path.name}"


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda path: f"{path.parent.parent.name}/{path.name}")
def test_each_program_is_valid_shell_without_its_comments(path: Path) -> None:
    # shell.script drops whole-line comments and blank lines: what is left must still parse.
    done = subprocess.run(["sh", "-n", "-c", shell.script(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_arguments_are_quoted_and_an_expanded_one_is_passed_as_written() -> None:
    command = shell.command('printf "%s|" "$@"', "name", "a b", "$HOME", shell.Expanded('"$v"'))
    assert command.endswith(""" name 'a b' '$HOME' "$v\"""")
    done = subprocess.run(["sh", "-c", f"v='x y'; {command}"], capture_output=True, text=True, check=True)
    assert done.stdout == "a b|$HOME|x y|"
