"""A warm start for the tests' pyinfra runs: this process imports pyinfra's CLI (which patches the standard
library for gevent, as the ``pyinfra`` script does), the connectors and this project once, then forks one
child per run that runs the CLI's own ``main`` with the run's arguments, directory, environment and output
files, exactly as ``pyinfra ARGS`` would from there on: each run is a process of its own, set up by ``main``.

Run as ``python -m tests.cli_server SOCKET``; ``tests/cli.py`` starts it and sends it one JSON line per run
on the Unix socket ``SOCKET``: ``{"argv", "cwd", "env", "stdout", "stderr"}`` (``stderr`` null: into
``stdout``). The child answers ``pid N`` at once and ``exit N`` when the run ends.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import socket
import sys
import traceback
from typing import Any

import pyinfra_cli.main as cli_main  # first: its package patches the standard library for gevent
from gevent import monkey

# Imported once here, after gevent's patches, as a run would import them.
WARM = (
    "pyinfra.connectors.chroot",
    "pyinfra.connectors.local",
    "pyinfra.connectors.ssh",
    "pyinfra_gpunode.pipelines.gpu_node",
    "pyinfra_gpunode.pipelines.readiness",
)
_waitpid = monkey.get_original("os", "waitpid")


def _exit_code(code: Any) -> int:
    """``sys.exit``'s argument as the process's exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run(request: dict[str, Any], connection: socket.socket) -> int:
    """In the child: the run's directory, environment and output, then the CLI's ``main``."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC) if request["stderr"] else out, 2)
    sys.argv = list(request["argv"])
    # As the script's own process: its directory first on the path, and a __main__ that is no module of a
    # package (click names the program from it).
    sys.path[0] = os.path.dirname(sys.argv[0])
    main = sys.modules["__main__"]
    main.__package__, main.__spec__, main.__file__ = None, None, sys.argv[0]
    connection.sendall(f"pid {os.getpid()}\n".encode())
    atexit._clear()  # the exit functions of this run alone, run as the interpreter runs them at its exit
    try:
        cli_main.main()
        code = 0
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException:  # as the interpreter would: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def _child(listener: socket.socket, connection: socket.socket, request: dict[str, Any]) -> None:
    listener.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 1
    try:
        code = _run(request, connection)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            connection.sendall(f"exit {code}\n".encode())
        finally:
            os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, _ = _waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(path: str) -> None:
    for name in WARM:
        importlib.import_module(name)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(16)
    os.rename(path + ".new", path)  # the socket appears once it accepts
    listener.settimeout(1)
    while os.getppid() == parent:  # ends with the test process that started it
        _reap()
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        with connection:
            connection.settimeout(30)
            request = json.loads(connection.makefile("rb").readline())
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:  # gevent's fork: the child's event loop is made anew
                _child(listener, connection, request)


if __name__ == "__main__":
    serve(sys.argv[1])
