"""Report each node's readiness chain, read-only, and fail the nodes that are not ready."""

from __future__ import annotations

import json
import weakref
from collections.abc import Generator
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import State, operation

from pyinfra_gpunode.facts.readiness import NodeReadiness
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._internals import current_state
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.readiness import NodeReadiness as Report
from pyinfra_gpunode.readiness import assess, fleet_json, fleet_text, node_text

# Per run (State): node name -> its report, read once (a run that checks for changes first reuses it).
REPORTS: weakref.WeakKeyDictionary[State, dict[str, Report]] = weakref.WeakKeyDictionary()
_PRINTED: weakref.WeakSet[State] = weakref.WeakSet()


@operation()
def reported(
    binary: str = "/usr/bin/nvidia-container-runtime",
    cdi_spec_path: str = "/etc/cdi/nvidia.yaml",
    json_path: str | None = None,
    fail_not_ready: bool = True,
    handler: str = "nvidia",
) -> Generator[Any, Any, None]:
    """
    Read the node's readiness chain in one command, changing nothing, and report it: once every
    node has been read, each node's chain in inventory order, then the fleet summary.

    + binary: path of the nvidia runtime binary containerd is given
    + cdi_spec_path: the CDI spec the node should have (any ``nvidia.com/gpu`` spec when absent)
    + json_path: file on the controller to write the whole report to as JSON, or None
    + fail_not_ready: fail a node that is not ready, naming its first broken link
    + handler: the runtime name the cluster's RuntimeClass uses (checked to run ``binary``)

    The report reads the same with and without ``--dry``; a node that is not ready fails when the
    operations run (``-y``), so the exit status is non-zero.

    **Example:**

    .. code:: python

        readiness.reported(name="readiness: every link of the chain")
    """
    run = current_state()
    reports = REPORTS.setdefault(run, {})
    if host.name not in reports:
        reports[host.name] = assess(host.name, node_fact(NodeReadiness, binary=binary), binary, cdi_spec_path, handler)
        _print_when_complete(run, reports, json_path)
    report = reports[host.name]
    first = report.first_broken
    if first is None or not fail_not_ready:
        host.noop(f"node is {'ready' if first is None else 'not ready at ' + first.id}")
    elif state.is_executing:
        yield fail(f"node not ready at {first.id}: {first.cause or first.detail}")


def _print_when_complete(run: State, reports: dict[str, Report], json_path: str | None) -> None:
    order = [node.name for node in run.inventory if node in run.active_hosts]
    if run in _PRINTED or not all(name in reports for name in order):
        return
    _PRINTED.add(run)
    ordered = [reports[name] for name in order]
    logger.info("--> Readiness\n%s\n%s", "\n".join(node_text(report) for report in ordered), fleet_text(ordered))
    if json_path:
        try:
            Path(json_path).write_text(json.dumps(fleet_json(ordered), indent=2) + "\n")
        except OSError as error:  # raising here would abort the run for every node
            logger.error("--> Readiness report not written to %s: %s", json_path, error)
        else:
            logger.info("--> Readiness report written to %s", json_path)
