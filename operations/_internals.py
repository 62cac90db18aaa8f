"""What this library relies on from pyinfra beyond its documented API, in one place.

The rollout conducts every node's turn from inside one operation: it needs the run's State (not
the context proxy) to key per-run bookkeeping on, pyinfra's pool to read nodes in parallel, each
host's operation results, and to run operations on another host as if outside an operation. Each
operation call's order, which pyinfra works out with ``inspect.stack()`` (every frame's source lines
read, for its line number), is worked out by one walk of the frames instead; the global arguments' names
and types, which pyinfra works out with ``get_type_hints`` for every operation, deploy and fact call,
once per process; their host-data defaults, which pyinfra looks up one by one through ``host.data`` (its
five sources called again for each of some thirty names), from the sources called once per call
(``faster_pyinfra``).
``tests/unit/test_pyinfra_internals.py`` checks each assumption against the installed pyinfra.
"""

from __future__ import annotations

import functools
import gc
import importlib
import sys
from collections.abc import Callable, Collection, Generator, Iterator
from contextlib import contextmanager
from copy import copy
from types import FrameType
from typing import Any, Protocol, TypeVar

import pyinfra
from pyinfra import host, state
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.host import Host, HostData
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import State
from pyinfra.api.util import PYINFRA_INSTALL_DIR
from pyinfra.context import ctx_host, ctx_state

# pyinfra.api.operation, the module (``pyinfra.api.operation`` also names its decorator)
PYINFRA_OPERATION_MODULE = importlib.import_module("pyinfra.api.operation")
# The modules that call ``all_global_arguments`` by their own global name.
PYINFRA_ARGUMENT_USERS = tuple(importlib.import_module(name) for name in ("pyinfra.api.arguments", "pyinfra.api.facts"))
PYINFRA_ALL_GLOBAL_ARGUMENTS: Callable[[], list[tuple[str, type]]] = PYINFRA_ARGUMENT_USERS[0].all_global_arguments
# The modules that call ``pop_global_arguments`` by their own global name: deploy, operation and fact calls.
PYINFRA_POP_USERS = tuple(
    importlib.import_module(name) for name in ("pyinfra.api.deploy", "pyinfra.api.operation", "pyinfra.api.facts")
)
PYINFRA_POP_GLOBAL_ARGUMENTS: Callable[..., tuple[Any, list[str]]] = PYINFRA_ARGUMENT_USERS[0].pop_global_arguments

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# The attributes pyinfra sets on a host while one of its operations runs (and resets after it).
OP_CONTEXT = ("in_op", "current_op_hash", "current_op_global_arguments", "current_op_deploy_data")


class Result(Protocol[T_co]):
    def get(self) -> T_co: ...


def current_state() -> State:
    """The State of this run, behind pyinfra's ``state`` context proxy (a key that lives as long as the run)."""
    run: State = state._get_module()  # type: ignore[attr-defined]
    return run


def current_host() -> Host:
    """The Host behind pyinfra's ``host`` context proxy."""
    node: Host = host._get_module()  # type: ignore[attr-defined]
    return node


def in_a_run() -> bool:
    """Whether pyinfra's ``host`` is a Host of a run (pyinfra-testing's fake hosts are not: they run an
    operation's function alone, with no State to keep bookkeeping on)."""
    return isinstance(current_host(), Host)


def current_operation() -> str | None:
    """The hash of the operation running on pyinfra's ``host``, None outside one."""
    op_hash: str | None = host.current_op_hash
    return op_hash


Operation = Callable[..., Any]  # a pyinfra operation (``@operation`` function)


def operation_body(function: Operation) -> Callable[..., Generator[Any, Any, None]]:
    """The generator function ``@operation`` wrapped: the operation's commands, called outside pyinfra's
    bookkeeping (pyinfra names it ``_inner`` for operations that run another's commands)."""
    body: Callable[..., Generator[Any, Any, None]] = getattr(function, "_inner")  # noqa: B009
    return body


def ordered_by_call_site() -> bool:
    """Whether pyinfra tells this process's operation calls apart by where they are called (the CLI); else
    (``add_op``, ``add_deploy``) by how many each node has called so far, so that the nodes of a run must call
    the same operations in the same order."""
    return bool(pyinfra.is_cli)


def spawn(run: State, function: Callable[..., T], *args: Any) -> Result[T]:
    """Run ``function(*args)`` in the run's pool (as pyinfra runs hosts in parallel); ``.get()`` waits for it."""
    assert run.pool is not None
    greenlet: Result[T] = run.pool.spawn(function, *args)
    return greenlet


def operation_result(run: State, node: Host, op_hash: str) -> OperationMeta:
    """What operation ``op_hash`` did on ``node`` in this run (``is_complete()``, ``did_change()``, ``stderr``)."""
    return run.ops[node][op_hash].operation_meta


def changed_operations(run: State, node: Host) -> list[str]:
    """The first name (sorted) of every operation that completed with a change on ``node``, in the order added."""
    return [
        sorted(run.op_meta[op_hash].names)[0]
        for op_hash, data in run.ops.get(node, {}).items()
        if data.operation_meta.is_complete() and data.operation_meta.did_change()
    ]


def first_failure(run: State, node: Host) -> tuple[str, str] | None:
    """The first name (sorted) and the stderr of the first of ``node``'s operations in this run that
    completed and failed, in the order added; None where none did."""
    for op_hash, data in run.ops.get(node, {}).items():
        meta = data.operation_meta
        if meta.is_complete() and not meta.did_succeed():
            return sorted(run.op_meta[op_hash].names)[0], meta.stderr
    return None


def failed_operation(error: NestedOperationError) -> str:
    """The hash of the nested operation whose failure raised ``error``."""
    op_hash: str = error.args[0]
    return op_hash


@contextmanager
def on_host(run: State, node: Host) -> Iterator[None]:
    """pyinfra's ``state`` and ``host`` are ``run`` and ``node`` inside the block.

    pyinfra does not restore them when the block raises: catch exceptions inside it."""
    with ctx_state.use(run), ctx_host.use(node):
        yield


@contextmanager
def outside_operation(node: Host) -> Iterator[None]:
    """``node``'s operations called in the block run at once (nested), as if no operation of it were running;
    its operation context is put back after the block, however it ends."""
    saved = {name: getattr(node, name) for name in OP_CONTEXT}
    node.in_op = False
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(node, name, value)


def node_changes(run: State, node: Host, ignored: Collection[str] = ()) -> int:
    """How many of ``node``'s operations in this run (nested ones included), but those whose hash is in
    ``ignored``, completed with a change or failed."""
    return sum(
        1
        for op_hash, data in run.ops.get(node, {}).items()
        if op_hash not in ignored
        and data.operation_meta.is_complete()
        and (data.operation_meta.did_change() or not data.operation_meta.did_succeed())
    )


def runs_after_prepare(run: State) -> bool:
    """Whether ``run``'s operations execute right after its prepare pass, with no change detection
    and no prompt between (the CLI's ``-y``, ``State(check_for_changes=False)``)."""
    return not run.should_check_for_changes()


def operation_order(run: State, skip: int = 1) -> list[int]:
    """What pyinfra's ``get_operation_order_from_stack`` returns for the same call stack (from the frame
    ``skip`` levels above this one outward), without ``inspect.stack()``: the line numbers of the frames
    outside pyinfra, from the outermost frame of the deploy file being run (the CLI's op file number
    first), by one walk of the frames that reads no source line."""
    frames: list[FrameType] = []
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    files = [found.f_code.co_filename for found in frames]
    start = len(frames)  # as pyinfra: where no frame is of the deploy file, its own frame alone (skipped)
    if run.current_deploy_filename and run.current_deploy_filename in files:
        start = files.index(run.current_deploy_filename)
    elif not run.current_deploy_filename:
        start = 0
    numbers = [run.current_op_file_number] if pyinfra.is_cli else []
    numbers += [
        found.f_lineno for found, name in zip(frames[start:], files[start:], strict=True)
        if not name.startswith(PYINFRA_INSTALL_DIR)
    ]  # fmt: skip
    return numbers


def prepared_kept() -> None:
    """In the pyinfra CLI, everything alive once a node's deploy has added its operations is kept out of the
    cyclic garbage collector's passes (``gc.freeze``): the CLI's run holds every node's operations and reads
    until it ends, with the process, and the collector's full passes rescanned that growing heap again and
    again (a quarter of the controller's time per node at 1,000 nodes). Called from Python (``add_deploy``,
    perhaps in a process that outlives the run), it does nothing."""
    if pyinfra.is_cli:
        gc.freeze()


_GLOBAL_ARGUMENTS: list[tuple[str, type]] = []


def global_arguments() -> list[tuple[str, type]]:
    """What pyinfra's ``all_global_arguments`` returns (every global argument's name and type, from
    ``get_type_hints`` of a TypedDict that does not change in a process), worked out once; a new list each call."""
    if not _GLOBAL_ARGUMENTS:
        _GLOBAL_ARGUMENTS.extend(PYINFRA_ALL_GLOBAL_ARGUMENTS())
    return list(_GLOBAL_ARGUMENTS)


class _SourcesRead:
    """``host.data`` as pyinfra's ``HostData`` answers ``getattr`` for the global arguments' names (the first of
    its sources holding the name, a shallow copy), from its sources called once: each name an attribute."""

    def __init__(self, data: HostData) -> None:
        for source in data.datas:  # the first source holding a name gives its value
            found = source() if callable(source) else source
            for name in _argument_names().intersection(found).difference(self.__dict__):
                self.__dict__[name] = copy(found[name])


@functools.cache
def _argument_names() -> frozenset[str]:
    """The global arguments' names (``global_arguments``), as a set, once per process."""
    return frozenset(name for name, _ in global_arguments())


class _ArgumentHost:
    """What pyinfra's ``pop_global_arguments`` reads of a host, and nothing else (a new read fails loudly)."""

    __slots__ = ("current_deploy_kwargs", "data")

    def __init__(self, node: Host) -> None:
        self.data = _SourcesRead(node.data)
        self.current_deploy_kwargs = node.current_deploy_kwargs


def pop_global_arguments(run: State, node: Host, kwargs: dict[str, Any]) -> tuple[Any, list[str]]:
    """pyinfra's ``pop_global_arguments``, its host-data defaults read from ``node.data``'s sources called once
    (pyinfra calls them again for every argument's name: a fifth of the controller's time per node)."""
    if type(getattr(node, "data", None)) is not HostData:
        return PYINFRA_POP_GLOBAL_ARGUMENTS(run, node, kwargs)
    return PYINFRA_POP_GLOBAL_ARGUMENTS(run, _ArgumentHost(node), kwargs)


def faster_pyinfra() -> None:
    """pyinfra orders this process's operation calls with ``operation_order`` (the same order, without reading
    every frame's source: about a third of the controller's time per node went there) and reads the global
    arguments from ``global_arguments`` (the same list, without evaluating type hints for every operation,
    deploy and fact call: a sixth of what was left) and pops them with ``pop_global_arguments``."""
    setattr(PYINFRA_OPERATION_MODULE, "get_operation_order_from_stack", operation_order)  # noqa: B010
    for module in PYINFRA_ARGUMENT_USERS:
        setattr(module, "all_global_arguments", global_arguments)  # noqa: B010
    for module in PYINFRA_POP_USERS:
        setattr(module, "pop_global_arguments", pop_global_arguments)  # noqa: B010
