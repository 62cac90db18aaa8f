"""One read per node for the host-preparation steps (kernel hold, unattended-upgrades, nouveau) that run back to back.

A step reads ``HostPrepState`` (all three parts in one command) and leaves the other parts for
the step right after it on the same node; that step takes its part only while nothing can have
changed the node since the read: it is the very next operation of this host, in the same pass,
and (when executing) every step since the read completed without running a command. Otherwise,
and outside an operation, a step reads its own fact.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, state
from pyinfra.api import FactBase, State

from pyinfra_gpunode.facts.kernel import HostPrepState, KernelState, NouveauBlacklist
from pyinfra_gpunode.facts.unattended_upgrades import UnattendedUpgradesState
from pyinfra_gpunode.operations._internals import current_host, current_state, operation_result

NOUVEAU_CONF = "/etc/modprobe.d/gpunode-blacklist-nouveau.conf"
_SINGLE: dict[str, type[FactBase[Any]]] = {
    "kernel": KernelState,
    "unattended": UnattendedUpgradesState,
    "nouveau": NouveauBlacklist,
}


@dataclass
class _Read:
    op_hash: str  # the last step that used this read
    executing: bool
    path: str
    parts: dict[str, Any] = field(default_factory=dict)


# Per run (State): host name -> the parts of its last HostPrepState read no step has taken yet.
_READS: weakref.WeakKeyDictionary[State, dict[str, _Read]] = weakref.WeakKeyDictionary()


def prep_state(part: str, nouveau_path: str = NOUVEAU_CONF, **kwargs: Any) -> Any:
    """This node's ``part`` (``kernel``, ``unattended`` or ``nouveau``) of ``HostPrepState`` as it is now;
    ``kwargs`` are the single fact's arguments."""
    op_hash = host.current_op_hash
    if op_hash is None:  # outside an operation: nothing to share
        return host.get_fact(_SINGLE[part], **kwargs)
    run = current_state()
    reads = _READS.setdefault(run, {})
    read = reads.pop(host.name, None)
    if read is None or part not in read.parts or not _unchanged_since(run, read, nouveau_path):
        parts = host.get_fact(HostPrepState, path=nouveau_path)
        read = _Read(op_hash, state.is_executing, nouveau_path, dict(parts))
    read.op_hash = op_hash
    value = read.parts.pop(part)
    if read.parts:
        reads[host.name] = read
    return value


def _unchanged_since(run: State, read: _Read, path: str) -> bool:
    order = host.op_hash_order
    if read.executing != state.is_executing or read.path != path:
        return False
    if read.op_hash not in order or host.current_op_hash not in order:
        return False
    if order.index(read.op_hash) + 1 != order.index(host.current_op_hash):
        return False
    if not state.is_executing:
        return True  # the prepare pass runs nothing
    meta = operation_result(run, current_host(), read.op_hash)
    return bool(meta.is_complete() and meta.did_succeed() and not meta.did_change())
