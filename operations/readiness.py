"""Report each node's readiness chain, read-only, and fail the nodes that are not ready."""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import uuid
import weakref
from collections.abc import Generator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import State, operation
from pyinfra.api.exceptions import PyinfraError

from pyinfra_gpunode.facts.cdi import SPEC_DIRS
from pyinfra_gpunode.facts.platform import ContainerdPlatform
from pyinfra_gpunode.facts.readiness import NodeReadiness, NodeReadinessInfo
from pyinfra_gpunode.log import logger, without_controls
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._internals import current_state
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.operations._shared import earlier_read, node_fact
from pyinfra_gpunode.platform import platform_containerd
from pyinfra_gpunode.readiness import NOT_READ, RunInfo, assess, fleet_json, fleet_text, node_text, unjudged
from pyinfra_gpunode.readiness import NodeReadiness as Report
from pyinfra_gpunode.settings import CDI_SPEC_PATH, CONTAINERD_MODE, PERSISTENCE_MODE, RUNTIME_BINARY, RUNTIME_HANDLER


def reports_of(run: State) -> dict[str, Report]:
    """Each node's readiness report in run ``run`` (pyinfra's ``State``), by host name, once ``reported`` read it."""
    return run_state(run).readiness


@operation()
def reported(
    binary: str = RUNTIME_BINARY,
    cdi_spec_path: str = CDI_SPEC_PATH,
    json_path: str | None = None,
    fail_not_ready: bool = True,
    cdi_spec_dirs: list[str] | None = None,
    handler: str = RUNTIME_HANDLER,
    mode: str = CONTAINERD_MODE,
    persistence_mode: str = PERSISTENCE_MODE,
) -> Generator[Any, Any, None]:
    """
    Read the node's readiness chain in one command, changing nothing, and report it: once every
    node has been read, each node's chain in inventory order, then the fleet summary.

    + binary: path of the nvidia runtime binary containerd is given
    + cdi_spec_path: the CDI spec the node should have (any ``nvidia.com/gpu`` spec when absent)
    + json_path: file on the controller to write the whole report to as JSON, or None
    + fail_not_ready: fail a node that is not ready, naming its first broken link
    + cdi_spec_dirs: CDI spec directories besides ``/etc/cdi`` and ``/var/run/cdi`` whose specs are
      checked too (containerd's ``cdi_spec_dirs``)
    + handler: the runtime name the cluster's RuntimeClass uses (checked to run ``binary``)
    + mode: ``runtime``, or ``nri`` (NRI mode): no nvidia runtime or handler asked for; containerd's
      merged config must have NRI and CDI on instead
    + persistence_mode: ``auto``, ``on`` or ``off`` (``gpunode_persistence_mode``): where it asks
      persistence mode on and the node has it off, its report carries a warning

    The report reads the same with and without ``--dry``; a node that is not ready fails when the
    operations run (``-y``), so the exit status is non-zero. The JSON file (schema 2), written at the
    end of every run (a run cut short included), names the run, lists every node's state and time of
    reading and a ``failures`` entry for each node not ready or not read;
    ``python -m pyinfra_gpunode.readiness_status [--max-age AGE] FILE`` exits 0, 1, 2 or 3 (a file not to
    trust) from it.

    **Example:**

    .. code:: python

        readiness.reported(name="readiness: every link of the chain")
    """
    run = current_state()
    reports = run_state(run).readiness
    if host.name not in reports:
        report_at_exit(json_path)
        try:
            facts = _readiness_facts(binary, cdi_spec_dirs)
            report = assess(host.name, facts, binary, cdi_spec_path, handler, mode, date.today(), persistence_mode)
        except PyinfraError:
            raise  # pyinfra's own: a connection or command failure, which fails this node as it should
        except Exception as error:  # a node's answer no check foresaw fails that node's report, not the run
            failed_read = host in run.failed_hosts  # pyinfra failed it and handed on a default value
            report = unjudged(host.name, FAILED_READ if failed_read else f"{type(error).__name__}: {error}")
        report.read_at = _now()
        reports[host.name] = report
        _print_when_complete(run, reports, json_path)
    report = reports[host.name]
    first = report.first_broken
    if first is None or not fail_not_ready:
        host.noop(f"node is {'ready' if first is None else 'not ready at ' + first.id}")
    elif state.is_executing:
        yield fail(f"node not ready at {first.id}: {without_controls(first.cause or first.detail)}")


FAILED_READ = "a read of this node failed (pyinfra printed its error above)"


def _readiness_facts(binary: str, cdi_spec_dirs: list[str] | None) -> NodeReadinessInfo:
    """The node's readiness read; the specs of directories besides the two default ones read too, and the
    containerd of k3s, RKE2 or k0s where one of them runs it (their unit, config and socket)."""
    extra = [path for path in cdi_spec_dirs or [] if path not in SPEC_DIRS]
    arguments: dict[str, Any] = {"cdi_dirs": extra} if extra else {}
    owner = earlier_read(ContainerdPlatform)  # a turn changes the node's config, never which platform runs it
    if platform_containerd(owner["name"], owner["unit"]):
        arguments.update(platform=owner["name"], unit=owner["unit"])
    return node_fact(NodeReadiness, binary=binary, **arguments)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def report_at_exit(json_path: str | None) -> None:
    """Once per run, as its first node's readiness step is added (``pipelines.readiness``) or read: the run's
    id and start, and a last write of the JSON report at ``json_path`` when the controller's process exits,
    for a run that ends (fails, is interrupted) before every node was read: a report of the last run is
    always there, the nodes it did not read marked so."""
    run = current_state()
    kept = run_state(run)
    if kept.readiness_run is not None:
        return
    kept.readiness_run = (uuid.uuid4().hex, _now())
    if json_path:
        atexit.register(_write_unless_complete, weakref.ref(run), json_path)


def _write_unless_complete(ref: weakref.ref[State], json_path: str) -> None:
    run = ref()
    if run is not None and not run_state(run).readiness_printed:
        _write_json(run, run_state(run).readiness, json_path, complete=False)


def _targets(run: State) -> list[str]:
    """The nodes run ``run`` is for, in inventory order: those it connected to or failed to (``--limit``
    leaves the others out)."""
    return [node.name for node in run.inventory if node in run.activated_hosts or node in run.failed_hosts]


def _unread(run: State, reports: dict[str, Report]) -> dict[str, str]:
    failed = "the node failed before its readiness was read (connection or command failed)"
    by_name = {node.name: node for node in run.inventory}
    return {
        name: failed if by_name[name] in run.failed_hosts else NOT_READ for name in _targets(run) if name not in reports
    }


def _write_json(run: State, reports: dict[str, Report], json_path: str, complete: bool) -> None:
    """The report as JSON at ``json_path``, written whole (a new file renamed over the old one) or not at all."""
    run_id, started = run_state(run).readiness_run or ("", "")
    targets = _targets(run)
    info = RunInfo(run_id, started, _now(), len(targets), complete)
    ordered = [reports[name] for name in targets if name in reports]
    document = fleet_json(ordered, _unread(run, reports), info)
    target = Path(json_path)
    temp = None
    try:
        handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(handle, "w") as out:
            out.write(json.dumps(document, indent=2) + "\n")
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except OSError as error:  # raising here would abort the run for every node
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
        logger.error("--> Readiness report not written to %s: %s", json_path, error)
        return
    cut = "" if complete else " (the run did not read every node)"
    logger.info("--> Readiness report written to %s%s", json_path, cut)


def _print_when_complete(run: State, reports: dict[str, Report], json_path: str | None) -> None:
    if run_state(run).readiness_printed or len(reports) < run.inventory.len_active_hosts():
        return  # not every node read yet, known without a walk of the inventory for each node
    order = [node.name for node in run.inventory if node in run.active_hosts]
    if not all(name in reports for name in order):
        return
    run_state(run).readiness_printed = True
    ordered = [reports[name] for name in order]
    unread = "".join(f"\n  unreadable: {name}" for name in _unread(run, reports))
    text = "\n".join(node_text(report) for report in ordered)
    logger.info("--> Readiness\n%s\n%s%s", text, fleet_text(ordered), unread)
    if json_path:
        _write_json(run, reports, json_path, complete=True)
