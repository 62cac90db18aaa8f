"""The readiness report's exit status, for scripts and CI.

0: the report is of a complete run and every node of its inventory is ready; 1: a node is not ready (every
node read); 2: a node could not be read, or the run ended before it read one; 3: the file cannot be trusted
as a report of the last run: unreadable, not JSON, not a report of this schema, malformed, of no nodes, or
older than ``--max-age``. Never a traceback.

pyinfra's CLI exits 0 or 1 only (1 for any failed node), so the outcomes are read from the JSON report
deploys/readiness.py writes at the end of every run::

    pyinfra -y INVENTORY deploys/readiness.py --data gpunode_readiness_json=readiness.json
    python -m pyinfra_gpunode.readiness_status --max-age 15m readiness.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pyinfra_gpunode.readiness import NOT_READY, READY, SCHEMA, UNREADABLE

NOT_TRUSTED = 3
MAX_BYTES = 64 << 20
_AGE = re.compile(r"^([0-9]+)([smhd]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Untrusted(Exception):
    """Why a report cannot be trusted (exit status 3)."""


def max_age(text: str) -> float:
    """``--max-age``: seconds, or a number with ``s``, ``m``, ``h`` or ``d``."""
    match = _AGE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"--max-age takes a number of seconds or e.g. 15m, 2h; got {text!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def _time(value: Any, what: str) -> datetime:
    try:
        found = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise Untrusted(f"{what} is not a time: {value!r}") from None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def _checked(document: Any) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
    """The report's run and nodes, every field the status reads checked for its type."""
    if not isinstance(document, dict):
        raise Untrusted("it is not a JSON object")
    if document.get("schema") != SCHEMA:
        raise Untrusted(f"it is not a readiness report of schema {SCHEMA} (schema: {document.get('schema')!r})")
    run, nodes = document.get("run"), document.get("nodes")
    if not isinstance(run, dict) or not isinstance(nodes, list):
        raise Untrusted("it has no 'run' object or no 'nodes' list")
    if not isinstance(run.get("complete"), bool) or not isinstance(run.get("inventory_nodes"), int):
        raise Untrusted("its 'run' lacks 'complete' or 'inventory_nodes'")
    if not nodes or run["inventory_nodes"] < 1:
        raise Untrusted("it reports no node")
    names = []
    for node in nodes:
        if not isinstance(node, dict) or not isinstance(node.get("node"), str):
            raise Untrusted("a node entry has no name")
        if node.get("state") not in (READY, NOT_READY, UNREADABLE):
            raise Untrusted(f"node {node['node']!r} has no known state: {node.get('state')!r}")
        names.append(node["node"])
    if len(set(names)) != len(names) or len(names) != run["inventory_nodes"]:
        raise Untrusted(f"it names {len(set(names))} distinct node(s), its run's inventory {run['inventory_nodes']}")
    return run, nodes


def status_of(path: str, older_than: float | None = None, now: datetime | None = None) -> tuple[int, str]:
    """``(exit status, one line saying why)`` for the report at ``path``; ``older_than`` (seconds): a report
    whose run ended longer ago is not trusted."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise Untrusted(f"it is larger than {MAX_BYTES} bytes")
        run, nodes = _checked(json.loads(raw.decode("utf-8")))
        ended = _time(run.get("ended"), "its run's end")
        age = ((now or datetime.now(UTC)) - ended).total_seconds()
        if older_than is not None and age > older_than:
            raise Untrusted(f"its run ended {int(age)} s ago, more than --max-age {int(older_than)} s")
    except Untrusted as why:
        return NOT_TRUSTED, f"readiness report {path!r} cannot be trusted: {why}"
    except (OSError, ValueError, RecursionError) as error:
        return NOT_TRUSTED, f"readiness report {path!r} cannot be read: {error}"
    failing = [node for node in nodes if node["state"] != READY]
    named = ", ".join(f"{node['node']} {node['state']}" for node in failing)
    if any(node["state"] == UNREADABLE for node in failing):
        return 2, f"{len(failing)} node(s) failing: {named}" + ("" if run["complete"] else " (the run was cut short)")
    if failing:
        return 1, f"{len(failing)} node(s) failing: {named}"
    if not run["complete"]:  # every node listed ready, yet the run says it did not read them all
        return NOT_TRUSTED, f"readiness report {path!r} cannot be trusted: its run did not complete"
    return 0, f"every node ready ({len(nodes)}), run {run.get('id')!s} ended {run.get('ended')!s}"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pyinfra_gpunode.readiness_status",
        description="Exit 0 every node ready, 1 a node not ready, 2 a node not read, 3 a report not to trust.",
    )
    parser.add_argument("report", help="the JSON file gpunode_readiness_json names")
    parser.add_argument("--max-age", type=max_age, help="refuse (3) a report whose run ended longer ago (15m, 2h)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # argparse's usage errors exit 2, which means "a node not read" here
        return NOT_TRUSTED if exit.code else 0
    status, line = status_of(args.report, args.max_age)
    print(line, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
