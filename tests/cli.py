"""The pyinfra CLI as the tests run it: this environment's ``pyinfra`` in a process of its own, so it
sets itself up (gevent, logging, the ``deploys/`` path) as it does for users.

Each run is a child forked by ``tests/cli_server.py``, which imported pyinfra's CLI and this project once
(about 1.3 s a run saved), running the CLI's ``main`` from there on; ``GPUNODE_TESTS_CLI=exec`` runs the
``pyinfra`` script itself each time instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).with_name("pyinfra")
SERVER_START = 60  # seconds the server may take to import what it keeps warm

_server: dict[str, object] = {}
_server_lock = threading.Lock()


def pyinfra(
    *args: str | Path,
    cwd: Path = REPO,
    merged: bool = True,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``pyinfra ARGS`` run in ``cwd`` (the checkout by default: deploy files are named relative to it).

    ``merged``: stderr goes into stdout, which then carries the whole log in order; otherwise the two
    are kept apart. ``env`` is added to this process's environment.
    """
    argv = [str(PYINFRA), *map(str, args)]
    environment = {**os.environ, **env} if env is not None else dict(os.environ)
    if os.environ.get("GPUNODE_TESTS_CLI") == "exec":
        return subprocess.run(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            text=True,
            timeout=timeout,
            env=environment,
        )
    return _forked(argv, Path(cwd), merged, timeout, environment)


def _forked(
    argv: list[str], cwd: Path, merged: bool, timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``argv`` run by a child of the warm server, its output read from files as the run wrote it."""
    with tempfile.TemporaryDirectory(prefix="gpunode-cli.") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        out.touch()
        if not merged:
            err.touch()
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out)}
        request["stderr"] = None if merged else str(err)
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(_socket_path())
            connection.sendall(json.dumps(request).encode() + b"\n")
            lines = connection.makefile("r")
            pid, code = None, None
            try:
                while code is None:
                    connection.settimeout(max(0.01, deadline - time.monotonic()))
                    line = lines.readline()
                    if not line:
                        code = -signal.SIGKILL  # the child ended without saying how: killed
                    elif line.startswith("pid "):
                        pid = int(line.split()[1])
                    elif line.startswith("exit "):
                        code = int(line.split()[1])
            except BaseException as error:  # as subprocess.run: a timeout or an interrupt kills the run
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                if isinstance(error, TimeoutError):
                    raise subprocess.TimeoutExpired(argv, timeout, output=out.read_text(errors="replace")) from None
                raise
        stdout = out.read_text(errors="replace")
        stderr = None if merged else err.read_text(errors="replace")
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _socket_path() -> str:
    """The warm server's socket, the server started on first use (one per test process)."""
    with _server_lock:
        if _server.get("pid") != os.getpid():
            scratch = tempfile.mkdtemp(prefix="gpunode-cli-server.")
            path = os.path.join(scratch, "socket")
            server = subprocess.Popen(
                [sys.executable, "-m", "tests.cli_server", path],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            atexit.register(_stop, server, scratch)
            deadline = time.monotonic() + SERVER_START
            while not os.path.exists(path):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the pyinfra test server did not start (exit status {server.poll()})")
                time.sleep(0.05)
            _server.update(pid=os.getpid(), path=path)
        return str(_server["path"])


def _stop(server: subprocess.Popen[bytes], scratch: str) -> None:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
    Path(scratch, "socket").unlink(missing_ok=True)
    os.rmdir(scratch)
