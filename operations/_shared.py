"""One read per node (``NodeSnapshot``) for the facts the deploys read before they change anything.

The first fact asked for through ``node_fact`` on a node reads the node's whole snapshot. Every
fact the snapshot holds is part of another (``ContainerdService`` of ``ContainerdNodeState``, that
of ``NodeReadiness``, that of the snapshot), as each composite fact declares its parts (``parts``,
``facts/_composite.py``), and a fact asked for later is taken from the newest read of itself or of
a fact that holds it, as long as that read is current: no operation of the node has completed with
a change, or failed, or run a command, since it was taken (an operation that declares
``facts_unchanged``, a backup, does not count), and it was taken in the same pass (prepare, or
execute) or, when pyinfra skips change detection (``-y``: the operations run right after the
prepare pass, no prompt between), in the prepare pass. Otherwise ``node_fact`` reads that one
fact (containerd's service, files and dump: ``ContainerdNodeState``, which holds all three) and
keeps it for the facts it holds; a pass that has no snapshot of its own to go on reads the
snapshot again. On pyinfra-testing's fake hosts it reads the one fact.

A fact asked for through ``node_fact`` after a command of the operation asking ran is read again:
``locked_before_changes`` (``_lock.py``) tells ``command_ran`` after each command of the operations
it wraps, every operation that changes a node. Elsewhere read again with ``host.get_fact`` once a
command ran.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pyinfra import host, state
from pyinfra.api import FactBase, State

from pyinfra_gpunode.facts._composite import holders
from pyinfra_gpunode.facts.containerd import (
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdNodeState,
    ContainerdService,
)
from pyinfra_gpunode.facts.kernel import NOUVEAU_CONF
from pyinfra_gpunode.facts.node import NodeSnapshot
from pyinfra_gpunode.operations._internals import (
    current_host,
    current_operation,
    current_state,
    in_a_run,
    node_changes,
    runs_after_prepare,
)
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.settings import RUNTIME_BINARY

T = TypeVar("T")
Fact = type[FactBase[Any]]

DEFAULT_BINARY = RUNTIME_BINARY


_NOT_HELD = object()  # a part the fact holding it did not read

# Each fact a read of the node snapshot holds -> the composite facts holding it, as they declare their
# parts (``facts._composite.Part``: where in the composite's value, and with which arguments).
_HOLDERS = holders(NodeSnapshot)


@dataclass(frozen=True)
class _Read:
    fact: Fact
    arguments: dict[str, Any]
    executing: bool
    changes: int  # the node's completed operations that changed it or failed, and reads set aside, at the read
    value: Any


# Read the fact holding these when they are not current: one read then serves the others as well.
_READ_WHOLE = (ContainerdService, ContainerdConfigFiles, ContainerdConfigDump)


def facts_unchanged() -> None:
    """The running operation's commands change nothing any fact here reads (a backup under
    ``/var/lib``): the reads taken before it stay current."""
    op_hash = current_operation()
    if in_a_run() and op_hash:
        run_state(current_state()).unchanging_operations.add(op_hash)


def command_ran() -> None:
    """A command of the running operation ran on this node (``locked_before_changes`` says so after each):
    from now on no read of the node taken before it is current, so a fact asked for after it through
    ``node_fact`` is read again, unless the operation declared ``facts_unchanged``. Only while executing
    (the prepare pass runs no command)."""
    if not in_a_run() or not state.is_executing:
        return
    run = current_state()
    if current_operation() not in run_state(run).unchanging_operations:
        read_afresh(run, host.name)


def read_afresh(run: State, name: str) -> None:
    """No read of node ``name`` taken so far is current any more: its next facts are read again (a
    rollout turn, once it holds the node lock, decides from what it reads itself)."""
    counts = run_state(run).reads_set_aside
    counts[name] = counts.get(name, 0) + 1


def _generation(run: State, node: Any) -> int:
    """What makes a read current: the node's changes and failures so far, and its reads set aside."""
    found = run_state(run)
    set_aside = found.reads_set_aside.get(node.name, 0)
    if not state.is_executing:  # no operation has run yet
        return set_aside
    return node_changes(run, node, found.unchanging_operations) + set_aside


def snapshot_binary(binary: str) -> None:
    """This node's snapshots check for runtime ``binary`` (its host data), so the containerd and
    readiness facts asked for with it come from the snapshot."""
    if in_a_run():
        run_state(current_state()).snapshot_binaries[host.name] = binary


def node_fact(fact: type[FactBase[T]], **kwargs: Any) -> T:
    """``host.get_fact(fact, **kwargs)``, from a current read of this node where one holds it (see the module)."""
    if fact not in _HOLDERS or not in_a_run():
        return host.get_fact(fact, **kwargs)
    node = current_host()
    run = current_state()
    reads = run_state(run).reads.setdefault(node.name, [])
    changes = _generation(run, node)
    wanted = _arguments(fact, kwargs)
    found = _found(run, node.name, fact, wanted, reads, changes)
    if found is not _NOT_HELD:
        return cast(T, found)
    binary = run_state(run).snapshot_binaries.get(node.name, DEFAULT_BINARY)
    if not any(read.fact is NodeSnapshot and _carried(read) for read in reads):  # this pass's first read
        whole: tuple[Fact, dict[str, Any]] = (NodeSnapshot, {"binary": binary, "nouveau_path": NOUVEAU_CONF})
    elif fact in _READ_WHOLE:
        whole = (ContainerdNodeState, {"binary": binary})
    else:
        whole = (fact, wanted)
    value = host.get_fact(whole[0], **whole[1])
    reads.append(_Read(whole[0], _arguments(whole[0], whole[1]), state.is_executing, changes, value))
    found = _current_value(fact, wanted, reads, changes)
    if found is not _NOT_HELD:
        return cast(T, found)
    reads.append(_Read(fact, wanted, state.is_executing, changes, host.get_fact(fact, **kwargs)))
    return cast(T, reads[-1].value)


def reads_stamp() -> Hashable:
    """What this node's reads are now, as a value equal to a later one while every fact ``node_fact`` returns
    stays the same: no read added or set aside, no change on the node, and (while executing) the run going on
    from the prepare pass's reads. Unequal to every other where nothing is kept (outside a run)."""
    if not in_a_run():
        return object()
    node, run = current_host(), current_state()
    carried = not state.is_executing or runs_after_prepare(run)
    return (node.name, len(run_state(run).reads.get(node.name, [])), _generation(run, node), carried or object())


def earlier_read(fact: type[FactBase[T]], **kwargs: Any) -> T:
    """``fact`` as the newest read of this node in this pass holds it, current or not (no read again after a
    change), else ``node_fact``'s: for a caller that needs only what no operation here changes, e.g. which
    platform runs containerd and under which unit, once a rollout turn changed the node's config."""
    if fact in _HOLDERS and in_a_run():
        reads = [read for read in run_state(current_state()).reads.get(current_host().name, []) if _carried(read)]
        wanted = _arguments(fact, kwargs)
        found = next((value for arguments, value in _held(fact, reads) if arguments == wanted), _NOT_HELD)
        if found is not _NOT_HELD:
            return cast(T, found)
    return node_fact(fact, **kwargs)


def decided_once(step: str, read: object, key: Hashable, decide: Callable[[], T]) -> T:
    """``decide()``, made once per node per read: the step's earlier decision on this node while ``read`` (the
    value ``node_fact`` returned, which the decision is made from) is the same read and ``key`` (the step's
    arguments) the same; else decided again. Outside a run, always decided."""
    if not in_a_run():
        return decide()
    decisions = run_state(current_state()).decisions
    slot = (current_host().name, step)
    earlier = decisions.get(slot)
    if earlier is not None and earlier[0] is read and earlier[1] == key:
        return cast(T, earlier[2])
    found = decide()
    decisions[slot] = (read, key, found)
    return found


def _found(run: State, name: str, fact: Fact, wanted: dict[str, Any], reads: list[_Read], changes: int) -> Any:
    """``_current_value``, looked up once per node while its reads, its changes and the pass stay the same (the
    steps of one node ask for the same facts dozens of times, each a walk through the snapshot's parts)."""
    stamp = (len(reads), changes, state.is_executing)
    kept = run_state(run).found.get(name)
    if kept is None or kept[0] != stamp:
        kept = run_state(run).found[name] = (stamp, {})
    key = (fact, repr(wanted))
    if key not in kept[1]:
        kept[1][key] = _current_value(fact, wanted, reads, changes)
    return kept[1][key]


def _current_value(fact: Fact, wanted: dict[str, Any], reads: list[_Read], changes: int) -> Any:
    """``fact`` with arguments ``wanted`` as the newest current read holding it has it, else ``_NOT_HELD``."""
    current = [read for read in reads if _current(read, changes)]
    return next((value for arguments, value in _held(fact, current) if arguments == wanted), _NOT_HELD)


def _held(fact: Fact, reads: list[_Read]) -> list[tuple[dict[str, Any], Any]]:
    """``(arguments, value)`` of ``fact`` as the current ``reads`` hold it, newest first."""
    found = [(read.arguments, read.value) for read in reversed(reads) if read.fact is fact]
    for whole, key, part in _HOLDERS.get(fact, []):
        for arguments, value in _held(whole, reads):
            held = part.held(key, arguments, value)
            if held is not None:
                found.append((_arguments(fact, held[0]), held[1]))
    return found


def _carried(read: _Read) -> bool:
    """Whether a read of this pass, or of the prepare pass right before it, counts now."""
    return read.executing == state.is_executing or runs_after_prepare(current_state())


def _current(read: _Read, changes: int) -> bool:
    return read.changes == changes and _carried(read)


def _arguments(fact: Fact, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``fact``'s command arguments ``kwargs`` with the defaults of those not given (a wrong name raises);
    bound once per fact and arguments (a node's reads ask for the same few, many times), a new dict each call."""
    key = (fact, repr(sorted(kwargs.items())))
    if key not in _BOUND:
        bound = _command_signature(fact).bind(**kwargs)
        bound.apply_defaults()
        if len(_BOUND) >= _BOUND_KEPT:
            _BOUND.clear()
        _BOUND[key] = dict(bound.arguments)
    return dict(_BOUND[key])


_BOUND: dict[tuple[Fact, str], dict[str, Any]] = {}
_BOUND_KEPT = 256


_SIGNATURES: dict[Fact, inspect.Signature] = {}


def _command_signature(fact: Fact) -> inspect.Signature:
    """The signature of ``fact``'s command (read once per fact class: it is asked for on every fact read)."""
    if fact not in _SIGNATURES:
        _SIGNATURES[fact] = inspect.signature(fact().command)
    return _SIGNATURES[fact]
