"""``tests/cli.py``: a pyinfra run forked from the warm server is what running the ``pyinfra`` script gives:
the same output, exit status, working directory and environment, stderr kept apart when asked; a run past
its timeout is killed and raises as ``subprocess.run`` does. The runs load an inventory file only (it
prints what it sees, then names no host): nothing reaches a host or this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import cli

PROBE = """\
import os, sys
print("probe:", os.environ.get("GPUNODE_PROBE"), os.getcwd())
print("probe on stderr", file=sys.stderr)
hosts = []
"""


def both(
    monkeypatch: pytest.MonkeyPatch, *args: str | Path, **kwargs: object
) -> list[subprocess.CompletedProcess[str]]:
    """The run through the warm server, then through the ``pyinfra`` script."""
    runs = [cli.pyinfra(*args, **kwargs)]  # type: ignore[arg-type]
    with monkeypatch.context() as patched:
        patched.setenv("GPUNODE_TESTS_CLI", "exec")
        runs.append(cli.pyinfra(*args, **kwargs))  # type: ignore[arg-type]
    return runs


def test_the_version_and_a_usage_error_are_as_the_script_gives_them(monkeypatch: pytest.MonkeyPatch) -> None:
    forked, executed = both(monkeypatch, "--version")
    assert (forked.returncode, forked.stdout) == (executed.returncode, executed.stdout) == (0, executed.stdout)
    assert "pyinfra: v3." in forked.stdout
    forked, executed = both(monkeypatch, "--no-such-option")
    assert forked.returncode == executed.returncode == 2
    assert forked.stdout == executed.stdout and "No such option" in forked.stdout


def test_directory_environment_and_stderr_reach_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "inventory.py").write_text(PROBE)
    runs = both(monkeypatch, "inventory.py", "exec", "--", "true", cwd=tmp_path, merged=False,
                env={"GPUNODE_PROBE": "seen"})  # fmt: skip
    for run in runs:
        assert f"probe: seen {tmp_path}" in run.stdout, run.stdout
        assert "probe on stderr" in (run.stderr or "") and "probe on stderr" not in run.stdout
    assert runs[0].returncode == runs[1].returncode
    assert runs[0].stderr == runs[1].stderr


SLEEPER = "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\nhosts = []\n"


def gone(pid_file: Path) -> bool:
    """Whether the run that wrote ``pid_file`` has ended within 5 s (reaped: no such process)."""
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    (tmp_path / "inventory.py").write_text(SLEEPER)
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cli.pyinfra("inventory.py", "exec", "--", "true", cwd=tmp_path, timeout=2)
    assert time.monotonic() - began < 10
    assert gone(tmp_path / "pid")


class Interrupted(Exception):
    pass


def test_an_interrupted_wait_kills_the_run(tmp_path: Path) -> None:
    """As ``subprocess.run``: an exception in the waiting test (Ctrl-C) does not leave the run going."""
    (tmp_path / "inventory.py").write_text(SLEEPER)

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 3)
    try:
        with pytest.raises(Interrupted):
            cli.pyinfra("inventory.py", "exec", "--", "true", cwd=tmp_path, timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert gone(tmp_path / "pid")
