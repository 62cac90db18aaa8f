"""The suite's shards (tests/conftest.py): together every test once, and no shard shares a fleet with another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARDS

REPO = Path(__file__).resolve().parents[2]


def collected(*arguments: str) -> set[str]:
    """The node ids ``pytest --collect-only`` selects from tests/integration with ``arguments``."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *arguments,
         "tests/integration"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return {line for line in result.stdout.splitlines() if line.startswith("tests/")}


@pytest.fixture(scope="module")
def shards() -> dict[str, set[str]]:
    return {shard: collected("--shard", shard) for shard in SHARDS}


def test_the_shards_hold_every_test_once(shards: dict[str, set[str]]) -> None:
    everything = collected()
    assert sum(len(ids) for ids in shards.values()) == len(everything)
    assert set().union(*shards.values()) == everything


def test_fleet_tests_are_split_by_the_fleet_they_use(shards: dict[str, set[str]]) -> None:
    booting = collected("-m", "fleet or vm")
    assert shards["fast"] == collected("-m", "not fleet and not vm")
    assert shards["session"] | shards["modules"] == booting
    modules = {node_id.split("::")[0] for node_id in shards["modules"]}
    session = {node_id.split("::")[0] for node_id in shards["session"]}
    assert not modules & session, "a test module's fleet tests stay in one shard"
    for path in modules:
        assert "def fleet(" in (REPO / path).read_text(), f"{path} boots a fleet of its own"
    for path in session:
        assert "def fleet(" not in (REPO / path).read_text(), f"{path} uses the shared fleets"
    assert "tests/integration/test_gpu_node_fleet.py" in session
    assert "tests/integration/test_rollout_batches_fleet.py" in modules
