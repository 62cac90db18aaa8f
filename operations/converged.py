"""Steps that have nothing to do on a node, run as one operation instead of one each.

On a converged node every step only says so (``host.noop``), yet each pyinfra operation call costs the
controller its own arguments, hash, order and bookkeeping for the run, per node: on a fleet the no-op run
was mostly that. ``taken`` asks each step of a group, while planning, whether it has anything to do on the
node (its body run to its first command, what it logs held back); where none has, the group is one
operation (``steps``). Executing on the plan's reads (``-y``, nothing changed on the node since), it says
what the steps said; on other reads it runs each step's body again, so it still does what the steps would
do had the node changed since. Elsewhere each step is its own operation, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gevent.local import local
from pyinfra import state
from pyinfra.api import operation

from pyinfra_gpunode.operations._internals import Operation, operation_body, ordered_by_call_site
from pyinfra_gpunode.operations._shared import reads_stamp


@dataclass(frozen=True)
class Step:
    """One step of a group: ``operation`` called with ``name`` and ``arguments``; ``when``: its condition
    (pyinfra's ``_if``, asked when it executes), None for none."""

    operation: Operation
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    when: Callable[[], bool] | None = None

    def skipped(self) -> bool:
        """Whether its condition, asked as pyinfra asks ``_if`` (only when executing), says no."""
        return state.is_executing and self.when is not None and not self.when()


Said = tuple[tuple[str, int, str], ...]  # what a step logged: logger name, level, message each


@dataclass(frozen=True)
class Planned:
    """What each step of a group said when the node was planned, and the node's reads then
    (``_shared.reads_stamp``)."""

    said: tuple[Said, ...]
    reads: Hashable


@operation()
def steps(steps: Sequence[Step], planned: Planned | None = None) -> Generator[Any, Any, None]:
    """
    Several steps as one operation: each step's commands, in order, as its own operation would yield them
    (none where each still has nothing to do), a step whose condition says no skipped. ``taken`` calls it for
    a group none of whose steps had anything to do when the node was planned.

    + steps: the steps (``Step``: the operation, its name, its arguments, its condition)
    + planned: what each step said when planned, and the node's reads then; while the node's reads are still
      those (nothing ran on it since, and the run goes on from the plan's reads), the steps are not asked
      again: what they said is said again

    **Example:**

    .. code:: python

        converged.steps(
            name="kernel: held; nouveau: blacklisted",
            steps=[Step(kernel.held, "kernel: held"), Step(kernel.nouveau_blacklisted, "nouveau: blacklisted")],
        )
    """
    replayed = planned is not None and reads_stamp() == planned.reads
    for index, step in enumerate(steps):
        if step.skipped():
            continue
        if planned is not None and replayed:
            for name, level, message in planned.said[index]:
                logging.getLogger(name).log(level, "%s", message)
            continue
        yield from operation_body(step.operation)(**step.arguments)


def taken(group: Sequence[Step]) -> None:
    """Each step of ``group`` as its own operation (its condition as ``_if``), or, while planning a node on
    which none of them has anything to do, all of them as one (``steps``, named by their names). Only where
    pyinfra tells operations apart by where they are called (the CLI): from Python it tells them apart by
    their count on each node, so every node must call the same ones."""
    planned = _planned(group) if ordered_by_call_site() and not state.is_executing and len(group) > 1 else None
    if planned is not None:
        steps(name="; ".join(step.name for step in group), steps=list(group), planned=planned)
        return
    for step in group:
        condition = {} if step.when is None else {"_if": step.when}
        step.operation(name=step.name, **step.arguments, **condition)


def _planned(group: Sequence[Step]) -> Planned | None:
    """What each of ``group``'s steps says on this node now, None where one of them yields a command (or
    raises: its own operation then raises it, as before). Nothing they log is printed."""
    said: list[Said] = []
    try:
        for step in group:
            held: list[tuple[str, int, str]] = []
            _PROBING.said = held
            commands = operation_body(step.operation)(**step.arguments)
            try:
                if next(commands, None) is not None:
                    return None
            except Exception:  # the step's own operation raises it again, naming the step
                return None
            finally:
                commands.close()
            said.append(tuple(held))
    finally:
        _PROBING.said = None
    return Planned(tuple(said), reads_stamp())


_PROBING = local()  # per greenlet: pyinfra plans the nodes side by side


class _HeldWhileProbing(logging.Filter):
    """A record this greenlet logs while its steps are asked is kept for them, not printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        said: list[tuple[str, int, str]] | None = getattr(_PROBING, "said", None)
        if said is None:
            return True
        said.append((record.name, record.levelno, record.getMessage()))
        return False


_FILTER = _HeldWhileProbing()
for _name in ("pyinfra", "pyinfra.gpunode"):  # host.noop's logger, and this project's
    logging.getLogger(_name).addFilter(_FILTER)
