"""The node lock's shell programs on real files and processes: another user can neither plant, hold nor
redirect the lock, unlock signals only the holder this run started, and a holder ends with its
connection's process or, while that lingers, once the lock goes unrenewed for HOLD seconds."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode import shell
from pyinfra_gpunode.operations import _lock

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changes owners and runs as another user (root)")

SHELL = Path(_lock.__file__).parent / "shell"
TAKE = shell.script(SHELL / "node-lock.sh")
RELEASE = shell.script(SHELL / "node-unlock.sh")
NOBODY = pwd.getpwnam("nobody").pw_uid

# The connection's process (sshd's session on a node): takes the lock as its child, prints the exit
# status, then lingers until it is killed. With a login shell named, the lock is taken as sshd runs a
# command: through that shell, with a command line it cannot hand over to sh by exec.
CONNECTION = (
    "import os, subprocess, sys, time\n"
    "login, script, *args = sys.argv[1:]\n"
    "env = dict(os.environ, TAKE=script, LOCK=args[1], HOLDER=args[2], HOLD=args[3])\n"
    'command = \'cd / && sh -c "$TAKE" gpunode-lock "$LOCK" "$HOLDER" "$HOLD"\'\n'
    "argv = [login, '-c', command] if login else ['sh', '-c', script, *args]\n"
    "r = subprocess.run(argv, stderr=subprocess.DEVNULL, env=env)\n"
    "print(r.returncode, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def base() -> Iterator[Path]:
    """A root-owned directory every user may enter (as /run is), for the lock's own directory."""
    path = Path(tempfile.mkdtemp(prefix="gpunode-lock-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def take(lock: Path, holder: str, hold: int = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", TAKE, "gpunode-lock", str(lock), holder, str(hold)], capture_output=True, text=True, timeout=60
    )


def release(lock: Path, holder: str) -> None:
    subprocess.run(["sh", "-c", RELEASE, "gpunode-lock", str(lock), holder], check=True, timeout=60)


@contextlib.contextmanager
def connection(lock: Path, holder: str, hold: int = 3600, login: str = "") -> Iterator[subprocess.Popen[str]]:
    """A process that took the lock for ``holder`` (through the login shell ``login`` where named) and
    lingers (killed on exit)."""
    process = subprocess.Popen(
        [sys.executable, "-c", CONNECTION, login, TAKE, "gpunode-lock", str(lock), holder, str(hold)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "0", f"{holder} did not take the lock"
        yield process
    finally:
        process.kill()
        process.wait()


def is_free(lock: Path) -> bool:
    with lock.open("rb") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def wait_free(lock: Path, within: float) -> float:
    """Seconds until the lock is free; fails after ``within`` seconds."""
    start = time.monotonic()
    while not is_free(lock):
        assert time.monotonic() - start < within, f"the lock is still held after {within} s"
        time.sleep(0.1)
    return time.monotonic() - start


@contextlib.contextmanager
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A root process that is no holder: whatever a lock file names, unlock must leave it alone."""
    process = subprocess.Popen(["sleep", "600"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_the_lock_is_held_in_a_root_only_directory_no_other_user_can_open(base: Path) -> None:
    lock = base / "gpunode" / "node.lock"
    assert take(lock, "run A").returncode == 0
    release(lock, "run A")
    wait_free(lock, within=5)

    # another user cannot open the file to hold the lock (nor read or write it)
    hold = subprocess.run(["runuser", "-u", "nobody", "--", "flock", "-n", str(lock), "true"], capture_output=True)
    assert hold.returncode != 0
    assert (lock.parent.stat().st_uid, lock.parent.stat().st_mode & 0o777) == (0, 0o700)
    assert (lock.stat().st_uid, lock.stat().st_mode & 0o777) == (0, 0o600)


def test_a_link_planted_at_the_lock_is_refused_and_its_target_unchanged(base: Path) -> None:
    directory = base / "gpunode"
    directory.mkdir(mode=0o700)
    target = base / "shadow"
    target.write_text("precious\n")
    (directory / "node.lock").symlink_to(target)

    result = take(directory / "node.lock", "run A")

    assert target.read_text() == "precious\n"
    assert result.returncode == 2
    assert result.stderr == f"node lock {directory / 'node.lock'} is a symbolic link: refusing it\n"
    assert (directory / "node.lock").is_symlink()


@pytest.mark.parametrize(("make", "kind"), [(os.mkfifo, "fifo"), (os.mkdir, "directory")])
def test_a_lock_that_is_not_a_regular_file_is_refused_naming_it(base: Path, make: object, kind: str) -> None:
    directory = base / "gpunode"
    directory.mkdir(mode=0o700)
    lock = directory / "node.lock"
    make(lock)  # type: ignore[operator]

    result = take(lock, "run A")

    assert result.returncode == 2
    assert result.stderr == f"node lock {lock} is not a regular file ({kind}): refusing it\n"


@pytest.mark.parametrize(
    ("uid", "mode"),
    [(NOBODY, 0o700), (0, 0o777), (0, 0o1777), (0, 0o770), (0, 0o702)],
    ids=["nobody's", "world-writable", "sticky-world-writable", "group-writable", "other-writable"],
)
def test_a_lock_directory_another_user_owns_or_may_write_is_refused_and_left_alone(
    base: Path, uid: int, mode: int
) -> None:
    directory = base / "gpunode"
    directory.mkdir()
    os.chown(directory, uid, 0)
    directory.chmod(mode)

    result = take(directory / "node.lock", "run A")

    assert result.returncode == 2
    assert result.stderr == (
        f"node lock directory {directory} is owned by uid {uid} with mode {mode:o}: "
        "it must be root's and writable by no one else; refusing it\n"
    )
    assert (directory.stat().st_uid, directory.stat().st_mode & 0o7777) == (uid, mode)
    assert list(directory.iterdir()) == []


def test_a_lock_directory_that_is_a_link_is_refused(base: Path) -> None:
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (base / "gpunode").symlink_to(elsewhere)

    result = take(base / "gpunode" / "node.lock", "run A")

    assert result.returncode == 2
    assert result.stderr == f"node lock directory {base / 'gpunode'} is a symbolic link: refusing it\n"
    assert list(elsewhere.iterdir()) == []


def test_a_lock_file_of_another_user_is_not_trusted(base: Path) -> None:
    directory = base / "gpunode"
    directory.mkdir(mode=0o700)
    lock = directory / "node.lock"
    with bystander() as victim:
        lock.write_text(f"run A\n{victim.pid}\n")
        os.chown(lock, NOBODY, 0)
        lock.chmod(0o600)

        release(lock, "run A")
        result = take(lock, "run A")

        time.sleep(0.3)
        assert victim.poll() is None, "unlock killed the pid another user wrote"
    assert result.returncode == 2
    assert result.stderr == (
        f"node lock {lock} is owned by uid {NOBODY} with mode 600: it must be root's and open to no one else; "
        "refusing it\n"
    )
    assert lock.read_text() == f"run A\n{victim.pid}\n"


def test_unlock_signals_only_the_holder_this_run_started(base: Path) -> None:
    lock = base / "gpunode" / "node.lock"
    with connection(lock, "run A"):
        holder_pid = int(lock.read_text().splitlines()[1])
        with bystander() as victim:
            # the file names this run, but its pid is some other root process (a reused pid, say)
            lock.write_text(f"run A\n{victim.pid}\n")
            release(lock, "run A")
            time.sleep(0.3)
            assert victim.poll() is None, "unlock killed a process that is not the holder"
        assert not is_free(lock)

        lock.write_text(f"run A\n{holder_pid}\n")
        release(lock, "run B")  # another run's unlock leaves this run's holder alone
        time.sleep(0.3)
        assert not is_free(lock)
        release(lock, "run A")
        wait_free(lock, within=5)


def test_a_second_run_waits_10_s_then_fails_naming_the_holder(base: Path) -> None:
    lock = base / "gpunode" / "node.lock"
    with connection(lock, "run A"):
        start = time.monotonic()
        second = take(lock, "run B")
        waited = time.monotonic() - start
    assert second.returncode == 1
    assert second.stderr == f"another run holds the node lock {lock}: run A\n"
    assert waited >= 10


def test_the_holder_ends_with_its_connection(base: Path) -> None:
    lock = base / "gpunode" / "node.lock"
    with connection(lock, "run A"):
        assert not is_free(lock)
    wait_free(lock, within=5)


@pytest.mark.parametrize("login", ["zsh", "fish", "bash"])
def test_the_holder_outlives_the_login_shell_that_ran_it(base: Path, login: str) -> None:
    lock = base / "gpunode" / "node.lock"
    path = shutil.which(login)
    assert path, f"{login} is not installed (scripts/setup.sh installs it)"
    with connection(lock, "run A", login=path):
        time.sleep(1.5)  # the login shell ended as soon as the lock was taken
        assert not is_free(lock), f"the lock ended with the {login} login shell, not with the connection"
    wait_free(lock, within=5)


def test_the_holder_ends_within_hold_seconds_while_its_connection_lingers(base: Path) -> None:
    lock = base / "gpunode" / "node.lock"
    with connection(lock, "run A", hold=3) as lingering:
        time.sleep(1)
        assert not is_free(lock)
        wait_free(lock, within=6)
        assert lingering.poll() is None


def test_a_renewal_keeps_the_lock_for_another_hold_seconds(base: Path) -> None:
    lock = base / "gpunode" / "node.lock"
    with connection(lock, "run A", hold=4):
        holder_pid = lock.read_text().splitlines()[1]
        time.sleep(2.5)
        renewal = take(lock, "run A", hold=4)
        assert renewal.returncode == 0, renewal.stderr
        assert lock.read_text().splitlines() == ["run A", holder_pid]  # the same holder, renewed
        time.sleep(2.5)
        assert not is_free(lock), "the renewed lock ended at its first deadline"
        wait_free(lock, within=6)
