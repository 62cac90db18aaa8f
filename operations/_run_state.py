"""What one pyinfra run keeps between its hosts and operations: one ``RunState`` per run (pyinfra's
``State``), from ``run_state(state)``, gone with the run.

Each module reads and writes its own fields; per node they are keyed by host name.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyinfra.api.state import State

if TYPE_CHECKING:
    from pyinfra_gpunode.operations._shared import _Read
    from pyinfra_gpunode.operations.containerd import Registration
    from pyinfra_gpunode.readiness import NodeReadiness as ReadinessReport
    from pyinfra_gpunode.rollout import NodeReport, NodeSettings, Outcome, RolloutPolicy
    from pyinfra_gpunode.settings import Settings


@dataclass
class RunState:
    """One run's bookkeeping, by concern."""

    # _shared.py: each node's reads, newest last; the runtime binary its snapshots check for; the operations
    # whose commands change nothing a fact reads (``facts_unchanged``); how often each node's reads were set
    # aside (``read_afresh``, ``command_ran``).
    reads: dict[str, list[_Read]] = field(default_factory=dict)
    snapshot_binaries: dict[str, str] = field(default_factory=dict)
    unchanging_operations: set[str] = field(default_factory=set)
    reads_set_aside: dict[str, int] = field(default_factory=dict)
    # Each node's facts as its current reads hold them, by fact and arguments (a marker where none holds
    # one), while its reads, its changes and the pass are as the stamp says.
    found: dict[str, tuple[tuple[int, int, bool], dict[tuple[Any, str], Any]]] = field(default_factory=dict)
    # pipelines/_settings.py: each node's host data as validated (its text, its settings).
    settings: dict[str, tuple[str, Settings]] = field(default_factory=dict)
    # Each node's newest decision per step (``decided_once``): the read it was made from, its key, the decision.
    decisions: dict[tuple[str, str], tuple[object, Hashable, object]] = field(default_factory=dict)

    # _lock.py: who this run is, as the node lock names its holder (None until it first takes one); the nodes
    # whose lock it holds, and when (monotonic seconds) it took or renewed each; the nodes whose changes take
    # the lock first (live nodes: an image or chroot is not locked).
    lock_holder: str | None = None
    locked: set[str] = field(default_factory=set)
    lock_taken: dict[str, float] = field(default_factory=dict)
    lock_live: set[str] = field(default_factory=set)

    # rollout.py: each node's rollout outcome (done, unchanged, failed, halted, ...), from the moment the
    # rollout is conducted (None before); what the earlier steps skipped or left pending, for the summary;
    # each node's read and settings as its dry-run plan judged them, for the rollout's plan.
    outcomes: dict[str, Outcome] | None = None
    reports: dict[str, NodeReport] = field(default_factory=dict)
    planned: dict[str, tuple[Registration, NodeSettings]] = field(default_factory=dict)
    # Each node's Kubernetes name for its hooks ("": none, or no hook) and machine id ("": none), as the
    # run read them: no two nodes of the rollout may share either.
    identities: dict[str, tuple[str, str]] = field(default_factory=dict)

    # readiness.py: each node's readiness report, read once (a run that checks for changes first reuses it);
    # whether the fleet's report was printed (and written: complete); the report's run id and start time.
    readiness: dict[str, ReadinessReport] = field(default_factory=dict)
    readiness_printed: bool = False
    readiness_run: tuple[str, str] | None = None

    # nvidia.py: the packages downloaded into each node's apt cache before the rollout's turns (name -> exact
    # version; "": any), which the node's turn installs without downloading.
    downloaded: dict[str, dict[str, str]] = field(default_factory=dict)

    # pipelines/gpu_node.py: the rollout's policy, worked out once from the whole inventory (None until
    # then); the nodes whose driver changes in their turn (the planned changes, the driver versions before
    # and after, and the steps that make them); every node's own rollout settings, added as each host's
    # deploy is added (hosts whose data was refused are not in it); the hosts whose deploy added its steps,
    # and whether the rollout's plan was printed.
    rollout_policy: RolloutPolicy | None = None
    driver_turns: dict[str, tuple[list[str], tuple[str, str], Callable[[], None]]] = field(default_factory=dict)
    nodes: dict[str, NodeSettings] = field(default_factory=dict)
    arrived: set[str] = field(default_factory=set)
    plan_printed: bool = False


_RUNS: weakref.WeakKeyDictionary[State, RunState] = weakref.WeakKeyDictionary()


def run_state(run: State) -> RunState:
    """The bookkeeping of run ``run`` (``operations._internals.current_state()`` inside an operation),
    made empty the first time it is asked for."""
    found = _RUNS.get(run)
    if found is None:
        found = _RUNS[run] = RunState()
    return found
