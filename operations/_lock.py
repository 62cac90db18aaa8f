"""The node lock: held by this run from its first change on a node, so two runs never change one node at once.

A node is locked only once this run is about to change it (``locked_before_changes``), so a run
that finds nothing to do on a node leaves its lock alone; ``rollout.node_locked`` takes it
explicitly (a rollout turn, before its before-hook) and ``rollout.node_unlocked`` releases it.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import uuid
from collections.abc import Callable, Generator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec

from pyinfra import host, state
from pyinfra.api import StringCommand
from pyinfra.api.state import State

from pyinfra_gpunode import shell
from pyinfra_gpunode.operations._internals import current_state, in_a_run
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.operations._shared import command_ran

P = ParamSpec("P")

# In a directory of the project's own, root's and 0700 (/run is a tmpfs: no lock outlives a boot).
LOCK = "/run/pyinfra-gpunode/node.lock"
# A holder ends at the latest this long after the lock was last taken or renewed, even while its
# connection's process lingers (an sshd session whose controller died); this run renews its lock
# before a change once half of that has passed.
HOLD_S = 3600

# Hold LOCK in a background process for as long as this connection lives (at most HOLD_S after it was
# last taken or renewed) or until node_unlocked ends it (shell/node-lock.sh); end the holder this run
# started, and only that one (shell/node-unlock.sh).
_TAKE_LOCK = shell.script(Path(__file__).parent / "shell" / "node-lock.sh")
_RELEASE_LOCK = shell.script(Path(__file__).parent / "shell" / "node-unlock.sh")


def lock_changes() -> None:
    """This node's changes in this run take the node lock first (call it while the deploy is added)."""
    if in_a_run():
        run_state(current_state()).lock_live.add(host.name)


def holds(run: State, name: str) -> bool:
    return name in run_state(run).locked


def renewal_due(taken: float, now: float, hold_s: float = HOLD_S) -> bool:
    """Whether a lock taken or renewed at ``taken`` (monotonic seconds) is renewed at ``now``: once half
    of the ``hold_s`` its holder keeps it without renewal has passed."""
    return now - taken >= hold_s / 2


def take() -> Generator[Any, Any, None]:
    """The command that takes this node's lock for this run (waiting up to 10 s for another run), if it
    does not hold it yet, or renews it when that is due; nothing while not executing."""
    run = current_state()
    if not state.is_executing:
        return
    now = time.monotonic()
    found = run_state(run)
    if holds(run, host.name) and not renewal_due(found.lock_taken[host.name], now):
        return
    if found.lock_holder is None:
        found.lock_holder = (
            f"pyinfra-gpunode run {uuid.uuid4().hex[:12]} from {socket.gethostname()} pid {os.getpid()} "
            f"since {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
        )
    yield StringCommand(shell.command(_TAKE_LOCK, "gpunode-lock", LOCK, found.lock_holder, str(HOLD_S)))
    found.locked.add(host.name)
    found.lock_taken[host.name] = now


def release() -> Generator[Any, Any, None]:
    """The command that ends this run's holder of this node's lock, if it holds it."""
    run = current_state()
    if not state.is_executing or not holds(run, host.name):
        return
    found = run_state(run)
    assert found.lock_holder is not None  # it holds a lock
    yield StringCommand(shell.command(_RELEASE_LOCK, "gpunode-lock", LOCK, found.lock_holder))
    found.locked.discard(host.name)


def lost(run: State, name: str) -> None:
    """Node ``name``'s holder is gone (it rebooted): its next change takes the lock again."""
    run_state(run).locked.discard(name)


def locked_before_changes(
    operation: Callable[P, Generator[Any, Any, None]],
) -> Callable[P, Generator[Any, Any, None]]:
    """An operation's generator that, on a node whose changes take the lock (``lock_changes``), takes
    it right before the operation's first command; an operation that yields nothing takes nothing.
    Once each of the operation's commands ran, no read of the node taken before it stays current
    (``_shared.command_ran``): what the operation asks ``node_fact`` for after it is read again."""

    @functools.wraps(operation)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Generator[Any, Any, None]:
        commands = operation(*args, **kwargs)
        try:
            first = next(commands, None)
            if first is None:
                return
            if host.name in run_state(current_state()).lock_live:
                yield from take()
            yield first
            command_ran()  # pyinfra resumes an operation once its command ran (a change check stops before)
            for command in commands:
                yield command
                command_ran()
        finally:
            commands.close()

    return wrapper
