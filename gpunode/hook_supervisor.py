"""The process that runs one controller-side hook and ends everything the hook started.

Run by ``hook_process`` as ``python -I <this file> STATUS_FD TIMEOUT GRACE PARENT_PID -- ARGV...``
(standard library only, so it starts the same from a checkout or a wheel). It makes itself a
child subreaper, so every process the hook starts stays its descendant even after ``setsid``
or a double fork, and asks the kernel for SIGTERM when the controller dies (also by SIGKILL).
It runs the hook in a process group of its own, with its stdout and stderr. When the hook
exits, its time is up, the controller asks (SIGTERM, SIGINT, SIGHUP) or the controller is
gone, every descendant left gets SIGTERM, then SIGKILL after the grace, and is reaped. Last it
writes one JSON object to STATUS_FD: the hook's exit status, why it was ended, and the pid
and command of every process it ended.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL = 0.05
COMMAND_CHARS = 200
REPORTED = 50  # processes named in the report; the rest are counted


def process_table() -> dict[int, tuple[int, str]]:
    """Every live (not zombie) process: pid -> (parent pid, command line), read from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                name, rest = stat.read().decode(errors="replace").rsplit(")", 1)
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read(COMMAND_CHARS * 2).rstrip(b"\0").replace(b"\0", b" ")
        except (OSError, ValueError):
            continue  # ended while read
        fields = rest.split()
        if fields[0] == "Z":
            continue
        command = argv.decode(errors="replace") or f"[{name.split('(', 1)[-1]}]"
        table[int(entry)] = (int(fields[1]), command[:COMMAND_CHARS])
    return table


def descendants(root: int, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    """The processes under ``root`` in ``table``: pid -> command line."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return found


def has_children() -> bool:
    """Whether this process has a child, alive or not yet reaped (the kernel's own answer, atomic: a child
    subreaper with none has no descendant left); none is reaped."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def end_descendants(grace: float, reap: Any) -> list[dict[str, Any]]:
    """SIGTERM every process under this one (a child subreaper), SIGKILL what is left after ``grace``
    seconds; ``reap()`` collects ended children between passes. Returns what was ended, by pid. A scan of
    /proc can miss a process that forked and exited while it was read (its child came after the listing,
    itself gone before its stat), so the end is the kernel's word: no child left."""
    root = os.getpid()
    ended: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + grace
    give_up = deadline + 5 * grace + 5  # a process that forks faster than it is killed
    while time.monotonic() < give_up:
        reap()
        alive = descendants(root, process_table())
        if not alive:
            if not has_children():
                break
            time.sleep(POLL / 5)  # a child the scan missed: the next finds it
            continue
        hard = time.monotonic() >= deadline
        for pid, command in alive.items():
            if pid in ended and not hard:
                continue
            entry = ended.setdefault(pid, {"pid": pid, "command": command, "signal": "TERM"})
            if hard:
                entry["signal"] = "KILL"
            try:
                os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(POLL / 2 if hard else POLL)
    reap()
    return sorted(ended.values(), key=lambda entry: entry["pid"])


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def supervise(argv: list[str], timeout: float, grace: float, parent: int) -> dict[str, Any]:
    """Run ``argv`` until it exits, ``timeout`` seconds pass or the controller ends it; end what it left."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    stop: list[str] = []

    def asked(number: int, _frame: Any) -> None:
        stop.append(
            "the controller is gone" if os.getppid() != parent else f"asked to stop ({signal.Signals(number).name})"
        )

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, asked)
    if os.getppid() != parent:
        return {"exit": None, "ended": "the controller is gone", "killed": [], "error": None, "seconds": 0.0}
    started = time.monotonic()
    try:
        hook = subprocess.Popen(argv, stdin=subprocess.DEVNULL, process_group=0)
    except OSError as exc:
        return {"exit": None, "ended": None, "killed": [], "error": str(exc), "seconds": 0.0}
    status: dict[str, int] = {}

    def reap() -> None:
        while True:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == hook.pid:
                status["exit"] = hook.returncode = os.waitstatus_to_exitcode(code)

    ended = None
    while "exit" not in status:
        reap()
        if stop:
            ended = stop[0]
        elif time.monotonic() - started >= timeout:
            ended = "timeout"
        if ended:
            break
        time.sleep(POLL)
    killed = end_descendants(grace, reap)
    return {
        "exit": status.get("exit"),
        "ended": ended,
        "killed": killed,
        "error": None,
        "seconds": round(time.monotonic() - started, 3),
    }


def main(args: list[str]) -> int:
    """``STATUS_FD TIMEOUT GRACE PARENT_PID -- ARGV...``: supervise the hook, write the report."""
    status_fd, timeout, grace, parent, separator, *argv = args
    if separator != "--" or not argv:
        print(f"usage: {sys.argv[0]} STATUS_FD TIMEOUT GRACE PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    report = supervise(argv, float(timeout), float(grace), int(parent))
    report["more"] = max(0, len(report["killed"]) - REPORTED)
    report["killed"] = report["killed"][:REPORTED]
    try:
        with os.fdopen(int(status_fd), "w") as out:
            json.dump(report, out)
    except BrokenPipeError:
        pass  # the controller is gone: nobody to tell
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
