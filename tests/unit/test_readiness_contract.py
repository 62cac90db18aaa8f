"""The readiness report as a contract: a ``schema`` version, one ``failures`` entry per node that is not
ready or could not be read, each node's detail, and the exit status scripts read from it."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from pyinfra_gpunode.readiness import NOT_READ, SCHEMA, RunInfo, assess, exit_status, fleet_json, unjudged
from pyinfra_gpunode.readiness_status import NOT_TRUSTED, max_age, status_of
from tests.unit.test_readiness import BINARY, SPEC, h200, healthy

REPO = Path(__file__).resolve().parents[2]


RUN = RunInfo("0123abcd", "2026-12-07T10:00:00+00:00", "2026-12-07T10:01:00+00:00", 3, True)
NOW = datetime(2026, 12, 7, 10, 5, tzinfo=UTC)


def document(unreadable: dict[str, str] | None = None, broken: bool = True, run: RunInfo | None = None) -> dict:
    reports = [assess("gpu1", healthy(), BINARY, SPEC)]
    if broken:
        reports.append(assess("gpu2", h200(), BINARY, SPEC))
    count = len(reports) + len(unreadable or {})
    info = run or RunInfo(RUN.id, RUN.started, RUN.ended, count, True)
    return json.loads(json.dumps(fleet_json(reports, unreadable, info)))


def test_the_report_carries_its_schema_run_failures_and_each_nodes_state() -> None:
    found = document({"gpu3": "connection refused"})
    assert found["schema"] == SCHEMA == 2
    assert found["run"] == {
        "id": "0123abcd",
        "started": "2026-12-07T10:00:00+00:00",
        "ended": "2026-12-07T10:01:00+00:00",
        "inventory_nodes": 3,
        "complete": True,
    }
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
    assert "read_at" in found["nodes"][0]


def test_exit_status_is_0_ready_1_not_ready_2_unreadable() -> None:
    assert exit_status(document(broken=False)) == 0
    assert exit_status(document()) == 1
    assert exit_status(document({"gpu3": "connection refused"})) == 2
    assert exit_status(document({"gpu3": "connection refused"}, broken=False)) == 2


def run_status(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pyinfra_gpunode.readiness_status", *args, str(path)]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)


def test_the_status_command_exits_with_the_reports_status(tmp_path: Path) -> None:
    for name, content, status in (
        ("ready.json", document(broken=False), 0),
        ("not-ready.json", document(), 1),
        ("unreadable.json", document({"gpu3": "connection refused"}), 2),
        ("cut-short.json", document({"gpu3": NOT_READ}, run=RunInfo("x", RUN.started, RUN.ended, 3, False)), 2),
    ):
        (tmp_path / name).write_text(json.dumps(content))
        done = run_status(tmp_path / name)
        assert done.returncode == status, (name, done.stdout, done.stderr)
    assert "2 node(s) failing: gpu2 not_ready, gpu3 unreadable (the run was cut short)" in done.stderr


def untrusted_files() -> dict[str, bytes]:
    ready = document(broken=False)
    files = {
        "empty": b"",
        "not JSON": b"{not json",
        "not UTF-8": b'{"schema": 2, "x": "\xff"}',
        "a list": b"[]",
        "schema 1": json.dumps({**ready, "schema": 1}).encode(),
        "no run": json.dumps({**ready, "run": None}).encode(),
        "no nodes": json.dumps({**ready, "nodes": []}).encode(),
        "zero inventory": json.dumps({**ready, "run": {**ready["run"], "inventory_nodes": 0}}).encode(),
        "fewer nodes than its inventory": json.dumps({**ready, "run": {**ready["run"], "inventory_nodes": 5}}).encode(),
        "a nameless node": json.dumps({**ready, "nodes": [{"state": "ready"}]}).encode(),
        "an unknown state": json.dumps({**ready, "nodes": [{**ready["nodes"][0], "state": "fine"}]}).encode(),
        "a run with no end": json.dumps({**ready, "run": {**ready["run"], "ended": 7}}).encode(),
        "ready but incomplete": json.dumps({**ready, "run": {**ready["run"], "complete": False}}).encode(),
        "nested too deep": b"[" * 100000 + b"]" * 100000,
    }
    return files


def test_a_file_that_cannot_be_trusted_is_3_and_named_never_a_traceback(tmp_path: Path) -> None:
    for name, content in untrusted_files().items():
        path = tmp_path / name.replace(" ", "-")
        path.write_bytes(content)
        status, line = status_of(str(path), now=NOW)
        assert status == NOT_TRUSTED, (name, line)
        assert line.startswith(f"readiness report {str(path)!r} cannot be "), (name, line)
    status, line = status_of(str(tmp_path / "missing.json"))
    assert status == NOT_TRUSTED and "missing.json" in line and "cannot be read" in line
    done = run_status(tmp_path / "empty")
    assert done.returncode == NOT_TRUSTED and "Traceback" not in done.stderr


def test_max_age_refuses_a_report_older_than_asked(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    path.write_text(json.dumps(document(broken=False)))  # its run ended at 10:01, 4 minutes before NOW
    assert status_of(str(path), older_than=300, now=NOW)[0] == 0
    status, line = status_of(str(path), older_than=180, now=NOW)
    assert status == NOT_TRUSTED and "ended 240 s ago, more than --max-age 180 s" in line
    assert run_status(path, "--max-age", "1m").returncode == NOT_TRUSTED  # the real clock: long after 10:01
    assert run_status(path, "--max-age", "forever").returncode == NOT_TRUSTED
    assert [max_age(text) for text in ("90", "90s", "15m", "2h", "1d")] == [90, 90, 900, 7200, 86400]


def test_a_node_whose_answer_cannot_be_judged_fails_alone_with_the_error() -> None:
    report = unjudged("gpu9", "RecursionError: maximum recursion depth exceeded\nwhile calling")
    assert not report.ready and report.first_broken is not None
    assert report.first_broken.cause == (
        "the controller could not judge this node's answer: RecursionError: maximum recursion depth exceeded"
        "<U+000A>while calling"
    )
    document = json.loads(json.dumps(fleet_json([report], None, RUN)))
    assert document["failures"] == [
        {"node": "gpu9", "state": "not_ready", "link": "read", "cause": report.first_broken.cause,
         "fix": "see the cause; report it"}
    ]  # fmt: skip
