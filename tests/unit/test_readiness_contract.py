"""The readiness report as a contract: a ``schema`` version, one ``failures`` entry per node that is not
ready or could not be read, each node's detail, and the exit status scripts read from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyinfra_gpunode.readiness import SCHEMA, assess, exit_status, fleet_json
from pyinfra_gpunode.readiness_status import NOT_A_REPORT, status_of
from tests.unit.test_readiness import BINARY, SPEC, h200, healthy

REPO = Path(__file__).resolve().parents[2]


def document(unreadable: dict[str, str] | None = None, broken: bool = True) -> dict:
    reports = [assess("gpu1", healthy(), BINARY, SPEC)]
    if broken:
        reports.append(assess("gpu2", h200(), BINARY, SPEC))
    return json.loads(json.dumps(fleet_json(reports, unreadable)))


def test_the_report_carries_its_schema_failures_and_each_nodes_state() -> None:
    found = document({"gpu3": "connection refused"})
    assert found["schema"] == SCHEMA == 1
    assert found["summary"]["total"] == 2  # the nodes read
    assert [(f["node"], f["state"], f["link"]) for f in found["failures"]] == [
        ("gpu2", "not_ready", "toolkit"),
        ("gpu3", "unreadable", None),
    ]
    assert found["failures"][0]["fix"].startswith("install nvidia-container-toolkit")
    assert found["failures"][1]["cause"] == "connection refused"
    assert [(node["node"], node["state"]) for node in found["nodes"]] == [
        ("gpu1", "ready"), ("gpu2", "not_ready"), ("gpu3", "unreadable"),
    ]  # fmt: skip
    assert found["nodes"][1]["links"] and found["nodes"][1]["versions"]["module"] == "580.159.04"


def test_exit_status_is_0_ready_1_not_ready_2_unreadable() -> None:
    assert exit_status(document(broken=False)) == 0
    assert exit_status(document()) == 1
    assert exit_status(document({"gpu3": "connection refused"})) == 2
    assert exit_status(document({"gpu3": "connection refused"}, broken=False)) == 2


def run_status(path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pyinfra_gpunode.readiness_status", str(path)]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)


def test_the_status_command_exits_with_the_reports_status(tmp_path: Path) -> None:
    for name, content, status in (
        ("ready.json", document(broken=False), 0),
        ("not-ready.json", document(), 1),
        ("unreadable.json", document({"gpu3": "connection refused"}), 2),
    ):
        (tmp_path / name).write_text(json.dumps(content))
        done = run_status(tmp_path / name)
        assert done.returncode == status, (name, done.stdout, done.stderr)
    assert "2 node(s) failing: gpu2 not_ready, gpu3 unreadable" in done.stderr


def test_a_file_that_is_not_a_report_of_this_schema_is_refused_by_name(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"summary": {}, "nodes": []}))
    assert status_of(str(old)) == (NOT_A_REPORT, f"{str(old)!r} is not a readiness report of schema 1 (schema: None)")
    status, line = status_of(str(tmp_path / "missing.json"))
    assert status == NOT_A_REPORT and "missing.json" in line and "cannot be read" in line
    assert run_status(old).returncode == NOT_A_REPORT
