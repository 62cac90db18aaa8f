"""Steps that have nothing to do on a node, run as one operation instead of one each.

On a converged node every step only says so (``host.noop``), yet each pyinfra operation call costs the
controller its own arguments, hash, order and bookkeeping for the run, per node: on a fleet the no-op run
was mostly that. ``taken`` asks each step of a group, while planning, whether it has anything to do on the
node (its body run to its first command, with nothing logged); where none has, the group is one operation
(``steps``) that runs each step's body again when it executes, so it still does what the steps would do
had the node changed since. Elsewhere each step is its own operation, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gevent.local import local
from pyinfra import state
from pyinfra.api import operation

from pyinfra_gpunode.operations._internals import Operation, operation_body, ordered_by_call_site


@dataclass(frozen=True)
class Step:
    """One step of a group: ``operation`` called with ``name`` and ``arguments``."""

    operation: Operation
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@operation()
def steps(steps: Sequence[Step]) -> Generator[Any, Any, None]:
    """
    Several steps as one operation: each step's commands, in order, as its own operation would yield them
    (none where each still has nothing to do). ``taken`` calls it for a group none of whose steps had
    anything to do when the node was planned.

    + steps: the steps (``Step``: the operation, its name, its arguments)

    **Example:**

    .. code:: python

        converged.steps(
            name="kernel: held; nouveau: blacklisted",
            steps=[Step(kernel.held, "kernel: held"), Step(kernel.nouveau_blacklisted, "nouveau: blacklisted")],
        )
    """
    for step in steps:
        yield from operation_body(step.operation)(**step.arguments)


def taken(group: Sequence[Step], **global_arguments: Any) -> None:
    """Each step of ``group`` as its own operation, or, while planning a node on which none of them has
    anything to do, all of them as one (``steps``, named by their names); ``global_arguments`` (``_if``)
    apply to each. Only where pyinfra tells operations apart by where they are called (the CLI): from Python
    it tells them apart by their count on each node, so every node must call the same ones."""
    if ordered_by_call_site() and not state.is_executing and len(group) > 1 and not any(map(_has_changes, group)):
        steps(name="; ".join(step.name for step in group), steps=list(group), **global_arguments)
        return
    for step in group:
        step.operation(name=step.name, **step.arguments, **global_arguments)


def _has_changes(step: Step) -> bool:
    """Whether ``step`` yields a command on this node now (a step that raises counts as one: its own
    operation then raises it, as before). Nothing it logs is printed."""
    with _quiet():
        commands = operation_body(step.operation)(**step.arguments)
        try:
            return next(commands, None) is not None
        except Exception:  # the step's own operation raises it again, naming the step
            return True
        finally:
            commands.close()


_PROBING = local()  # per greenlet: pyinfra plans the nodes side by side


class _NotWhileProbing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_PROBING, "on", False)


_FILTER = _NotWhileProbing()
for _name in ("pyinfra", "pyinfra.gpunode"):  # host.noop's logger, and this project's
    logging.getLogger(_name).addFilter(_FILTER)


@contextmanager
def _quiet() -> Generator[None, None, None]:
    """Nothing this greenlet logs inside the block is printed (other nodes' messages are)."""
    _PROBING.on = True
    try:
        yield
    finally:
        _PROBING.on = False
