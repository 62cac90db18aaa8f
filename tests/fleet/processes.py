"""Processes the harness starts, recorded by PID and start time so teardown signals only its own.

Each process is started in a session of its own; its PID is also its process group, which
teardown signals so that the children it forked (socat per connection, nspawn under its
wrapper) go with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Recorded:
    role: str
    pid: int
    start_time: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str) -> Recorded:
        return cls(**json.loads(text))


def start(role: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> Recorded:
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return Recorded(role, process.pid, _start_time(process.pid) or 0)


def is_running(process: Recorded) -> bool:
    _reap(process.pid)
    return _start_time(process.pid) == process.start_time and _state(process.pid) != "Z"


def stop(processes: Sequence[Recorded], timeout: float = 30.0) -> None:
    """SIGTERM each recorded process group, then SIGKILL what is left after ``timeout`` seconds."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        alive = [p for p in processes if is_running(p)]
        for process in alive:
            _signal_group(process, sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if is_running(p)]
        if not alive:
            return
    names = ", ".join(f"{p.role} ({p.pid})" for p in processes if is_running(p))
    raise RuntimeError(f"processes survived SIGKILL: {names}")


def _signal_group(process: Recorded, sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect the exit status of our own children, so they do not linger as zombies."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None
