"""The readiness report's exit status, for scripts and CI: 0 every node ready, 1 a node not ready,
2 a node that could not be read, 3 the file is not a readiness report of a schema this version reads.

pyinfra's CLI exits 0 or 1 only (1 for any failed node), so the three outcomes are read from the JSON
report deploys/readiness.py writes::

    pyinfra -y INVENTORY deploys/readiness.py --data gpunode_readiness_json=readiness.json
    python -m pyinfra_gpunode.readiness_status readiness.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from pyinfra_gpunode.readiness import SCHEMA, exit_status

NOT_A_REPORT = 3


def status_of(path: str) -> tuple[int, str]:
    """``(exit status, one line saying why)`` for the report at ``path``."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except (OSError, ValueError) as error:
        return NOT_A_REPORT, f"readiness report {path!r} cannot be read: {error}"
    if (
        not isinstance(document, dict)
        or document.get("schema") != SCHEMA
        or not isinstance(document.get("failures"), list)
    ):
        found = document.get("schema") if isinstance(document, dict) else None
        return NOT_A_REPORT, f"{path!r} is not a readiness report of schema {SCHEMA} (schema: {found!r})"
    status = exit_status(document)
    failures = document["failures"]
    if not failures:
        return status, f"every node ready ({document['summary']['total']})"
    named = ", ".join(f"{failure['node']} {failure['state']}" for failure in failures)
    return status, f"{len(failures)} node(s) failing: {named}"


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pyinfra_gpunode.readiness_status REPORT.json", file=sys.stderr)
        return NOT_A_REPORT
    status, line = status_of(argv[0])
    print(line, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
