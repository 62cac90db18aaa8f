"""Run a controller-side hook: its output logged line by line as it comes, bounded, and every process it
started ended at its timeout, on Ctrl-C and when the controller exits.

The hook runs under ``hook_supervisor`` (a process of ours, the same interpreter), which keeps every
process the hook starts as its descendant, ``setsid`` or not, and ends them all (SIGTERM, SIGKILL after
``GRACE`` seconds). The controller never waits longer than the timeout plus the grace plus
``MARGIN``: past that it kills the supervisor and what runs under it, and stops reading.

Under the pyinfra CLI (gevent's ``monkey.patch_all``) the waiting (``selectors``, ``Popen.wait``)
yields to other greenlets; through the API without monkey-patching it blocks like any call
there (the rollout is serial: nothing else runs during a turn).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra_gpunode.hook_supervisor import descendants, process_table
from pyinfra_gpunode.hooks import hook_argv, hook_environment, shown_argv
from pyinfra_gpunode.log import logger, printable

SUPERVISOR = str(Path(__file__).with_name("hook_supervisor.py"))
GRACE = 2.0  # seconds between SIGTERM and SIGKILL
MARGIN = 3.0  # seconds the supervisor gets beyond the timeout and grace before it is killed itself
LINE_BYTES = 4096  # a longer output line is cut there
KEPT_LINES = 20  # last lines kept for the failure message
CHUNK = 65536
DRAIN = 1.0  # seconds output is still read after the supervisor exited
NAMED = 5  # processes named in a one-line reason


@dataclass
class HookRun:
    """What a hook did: ``exit`` (its status, ``-N`` for signal N, ``None`` when it had none),
    ``ended`` (why it was ended: ``timeout``, ...; ``None`` when it exited by itself), ``killed``
    (pid, command and last signal of each process ended), ``error`` (why it could not start)."""

    exit: int | None = None
    ended: str | None = None
    killed: list[dict[str, Any]] = field(default_factory=list)
    more: int = 0
    error: str | None = None
    seconds: float = 0.0
    last_lines: list[str] = field(default_factory=list)


class LineCutter:
    """Bytes in, complete lines out (decoded, at most ``limit`` bytes each, the rest of a longer line dropped)."""

    def __init__(self, limit: int = LINE_BYTES) -> None:
        self.limit = limit
        self.partial = bytearray()
        self.cutting = False

    def feed(self, data: bytes) -> list[str]:
        """The lines ``data`` completes."""
        lines, start = [], 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if not self.cutting:
                self.partial += piece[: self.limit + 1 - len(self.partial)]
                if len(self.partial) > self.limit:
                    lines.append(_decoded(self.partial[: self.limit]) + " [line cut]")
                    self.partial.clear()
                    self.cutting = True
            if end < 0:
                return lines
            if self.cutting:
                self.cutting = False
            else:
                lines.append(_decoded(self.partial))
                self.partial.clear()
            start = end + 1

    def flush(self) -> list[str]:
        """The last line, when the output did not end with a newline."""
        rest = [] if self.cutting or not self.partial else [_decoded(self.partial)]
        self.partial.clear()
        return rest


def _decoded(data: bytes | bytearray) -> str:
    return bytes(data).decode(errors="replace").rstrip("\r")


def hook_failure(program: str, timeout: float, run: HookRun) -> str | None:
    """``None`` when the hook exited 0, else a one-line reason naming ``program`` (and what was killed)."""
    if run.error is not None:
        return f"{program} could not start: {run.error}"
    if run.ended == "timeout":
        return f"{program} timed out after {timeout:g} s (gpunode_hook_timeout) and was killed{_named(run)}"
    if run.ended is not None:
        return f"{program} was ended ({run.ended}){_named(run)}"
    if run.exit != 0:
        last = next((line.strip() for line in reversed(run.last_lines) if line.strip()), "no output")
        return f"{program} exited {run.exit} after {run.seconds:.1f} s: {last}"
    return None


def _named(run: HookRun) -> str:
    if not run.killed:
        return ""
    names = [f"{entry['pid']} {printable(entry['command'])}" for entry in run.killed[:NAMED]]
    more = len(run.killed) - NAMED + run.more
    return f" with what it started: {', '.join(names)}" + (f" and {more} more" if more > 0 else "")


class HookProcess:
    """One hook running under its supervisor, its output being read."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float, label: str, grace: float) -> None:
        self.label = label
        self.grace = grace
        self.deadline = time.monotonic() + timeout + grace + MARGIN
        self.cutter = LineCutter()
        self.kept: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.killed_here: list[dict[str, Any]] = []
        self.output, output_end = os.pipe()
        self.status, status_end = os.pipe()
        command = [sys.executable, "-I", SUPERVISOR, str(status_end), repr(timeout), repr(grace), str(os.getpid())]
        try:
            self.supervisor = subprocess.Popen(
                [*command, "--", *argv], env=dict(env), stdin=subprocess.DEVNULL, stdout=output_end,
                stderr=output_end, pass_fds=(status_end,), start_new_session=True,
            )  # fmt: skip
        except OSError:
            os.close(self.output)
            os.close(self.status)
            raise
        finally:
            os.close(output_end)
            os.close(status_end)
        os.set_blocking(self.output, False)
        os.set_blocking(self.status, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.output, selectors.EVENT_READ)
        self.open = True

    def follow(self, deadline: float) -> bool:
        """Log the output as it comes until the supervisor exited (``True``) or ``deadline`` passed."""
        exited_at = None
        while True:
            now = time.monotonic()
            if exited_at is None and self.supervisor.poll() is not None:
                exited_at = now
            if exited_at is not None and (not self.open or now - exited_at >= DRAIN):
                return True
            if now >= deadline:
                return False
            wait = min(deadline - now, 0.2)
            if not self.open:
                try:
                    self.supervisor.wait(wait)
                except subprocess.TimeoutExpired:
                    pass
            elif self.selector.select(wait):
                self._read()

    def _read(self) -> None:
        try:
            data = os.read(self.output, CHUNK)
        except BlockingIOError:
            return
        lines = self.cutter.feed(data) if data else self.cutter.flush()
        if not data:
            self.selector.unregister(self.output)
            self.open = False
        for line in lines:
            logger.info("%s | %s", self.label, line)
            self.kept.append(line)

    def stop(self) -> None:
        """Ask the supervisor to end the hook; kill it and what runs under it if it has not within the grace."""
        if self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
        if not self.follow(time.monotonic() + self.grace + MARGIN):
            self.kill()

    def kill(self) -> None:
        """SIGKILL the supervisor and every process under it, now."""
        under = descendants(self.supervisor.pid, process_table())
        for pid, command in under.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed_here.append({"pid": pid, "command": command, "signal": "KILL"})
        self.supervisor.kill()
        self.supervisor.wait()

    def finish(self) -> HookRun:
        """What the hook did (logging each process that was ended); closes the pipes."""
        for line in self.cutter.flush():
            logger.info("%s | %s", self.label, line)
            self.kept.append(line)
        report = self._report()
        self.selector.close()
        os.close(self.output)
        os.close(self.status)
        if report is None:
            ended = "its supervisor did not end in time and was killed"
            run = HookRun(ended=ended, killed=self.killed_here, last_lines=list(self.kept))
        else:
            run = HookRun(
                exit=report.get("exit"), ended=report.get("ended"), killed=report.get("killed", []),
                more=report.get("more", 0), error=report.get("error"), seconds=report.get("seconds", 0.0),
                last_lines=list(self.kept),
            )  # fmt: skip
        for entry in run.killed:
            logger.warning(
                "%s: ended pid %s (%s) with SIG%s", self.label, entry["pid"], printable(entry["command"]),
                entry["signal"],
            )  # fmt: skip
        if run.more:
            logger.warning("%s: ended %d more processes", self.label, run.more)
        return run

    def _report(self) -> dict[str, Any] | None:
        data = b""
        while len(data) < 1 << 20:
            try:
                chunk = os.read(self.status, CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        try:
            report = json.loads(data)
        except ValueError:
            return None
        return report if isinstance(report, dict) else None


LIVE: set[HookProcess] = set()


def run_hook(argv: Sequence[str], env: Mapping[str, str], timeout: float, label: str, grace: float = GRACE) -> HookRun:
    """Run a hook on the controller: each output line logged as it comes, everything it started ended
    when it exits, at its timeout, and on any exception here (Ctrl-C: re-raised once they are ended).

    + argv: the hook's argv (no shell)
    + env: its environment
    + timeout: seconds it may run before it and what it started are ended
    + label: what its log lines start with (``<label> | <line>``)
    + grace: seconds between SIGTERM and SIGKILL
    """
    try:
        process = HookProcess(argv, env, timeout, label, grace)
    except OSError as exc:
        return HookRun(error=str(exc))
    LIVE.add(process)  # until its processes are ended: at exit, they are ended then
    try:
        if not process.follow(process.deadline):
            process.kill()
    except BaseException:
        process.stop()
        LIVE.discard(process)
        process.finish()
        raise
    LIVE.discard(process)
    return process.finish()


def turn_hook(
    which: str,
    template: Sequence[str],
    timeout: float,
    node: str,
    hostname: str,
    changes: Sequence[str],
    *,
    prefix: str = "",
    turn: str = "1/1",
    batch: str = "batch 1/1",
    driver: tuple[str, str] = ("", ""),
) -> str | None:
    """Run a node's ``which`` hook (``before`` or ``after`` its rollout turn) on the controller, without a
    shell: ``template`` with ``{node}`` and ``{hostname}`` filled in (``hooks.hook_argv``), the controller's
    environment plus what the turn is about (``hooks.hook_environment``), for at most ``timeout`` seconds.
    ``None`` when it exited 0, else why not (``hook_failure``). ``prefix``: what the node's log lines
    start with; ``turn`` and ``batch``: where the turn stands in the rollout (``GPUNODE_TURN``,
    ``GPUNODE_BATCH``); ``driver``: the driver version before the turn and after (``GPUNODE_DRIVER_FROM``,
    ``GPUNODE_DRIVER_TO``)."""
    argv = hook_argv(template, node, hostname)
    env = hook_environment(os.environ, which, node, hostname, changes, turn, batch, driver)
    logger.info("%s%s-hook: %s", prefix, which, shown_argv(argv))
    run = run_hook(argv, env, timeout, f"{prefix}{which}-hook")
    return hook_failure(argv[0], timeout, run)


@atexit.register
def _end_live_hooks() -> None:
    """At exit (e.g. a Ctrl-C caught outside the greenlet running a hook): end every hook still running."""
    for process in list(LIVE):
        LIVE.discard(process)
        try:
            process.stop()
            process.finish()
        except Exception:
            process.kill()
