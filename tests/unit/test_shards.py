"""The suite's shards (tests/conftest.py): together every test once, and no shard shares a fleet with another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LONGEST_FIRST, shard_list

REPO = Path(__file__).resolve().parents[2]


def collected(*arguments: str) -> list[str]:
    """The output lines of ``pytest --collect-only`` over tests/integration with ``arguments``."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *arguments,
         "tests/integration"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def listing() -> dict[str, tuple[str, set[str]]]:
    """Each test of tests/integration: its shard and its ``fleet``/``vm`` marks, from one collection."""
    found = {}
    for line in collected("-p", "tests.shard_listing"):
        if line.startswith("SHARD "):
            node_id, shard, marks = line.removeprefix("SHARD ").rsplit(" ", 2)  # node ids may hold spaces
            found[node_id] = (shard, set(marks.split(",")) - {"-"})
    return found


def test_a_shard_runs_exactly_its_own_tests(listing: dict[str, tuple[str, set[str]]]) -> None:
    """``--shard`` deselects the others: the fast shard's collection is the listing's fast tests."""
    fast = {line for line in collected("--shard", "fast") if line.startswith("tests/")}
    assert fast == {node_id for node_id, (shard, _) in listing.items() if shard == "fast"}
    assert len(listing) > len(fast) > 0


def test_fleet_tests_are_split_by_the_fleet_they_use(listing: dict[str, tuple[str, set[str]]]) -> None:
    assert {shard for shard, _ in listing.values()} == {"session", "vm", "modules", "fast"}
    for node_id, (shard, marks) in listing.items():
        assert (shard == "fast") == (not marks), f"{node_id}: in {shard} with marks {marks}"
        assert (shard == "vm") == ("vm" in marks), f"{node_id}: in {shard} with marks {marks}"
    modules = {node_id.split("::")[0] for node_id, (shard, _) in listing.items() if shard == "modules"}
    session = {node_id.split("::")[0] for node_id, (shard, _) in listing.items() if shard == "session"}
    assert not modules & session, "a test module's fleet tests stay in one shard"
    for path in modules:
        assert "def fleet(" in (REPO / path).read_text(), f"{path} boots a fleet of its own"
    for path in session:
        assert "def fleet(" not in (REPO / path).read_text(), f"{path} uses the shared fleets"
    assert "tests/integration/test_gpu_node_fleet.py" in session
    assert "tests/integration/test_rollout_batches_fleet.py" in modules


def test_a_process_runs_its_first_shard_longest_modules_first_then_a_later_shard_from_its_end(
    listing: dict[str, tuple[str, set[str]]],
) -> None:
    """``--shard modules,session``: the module fleets' tests a module at a time, the ``LONGEST_FIRST`` modules
    first, then the rest in their order; then the session shard's modules from its last (a process taking
    another's modules starts where that one arrives last); each module's tests in their order."""
    order = [line for line in collected("--shard", "modules,session") if line.startswith("tests/")]
    modules: dict[str, dict[str, list[str]]] = {"modules": {}, "session": {}}
    for node_id, (shard, _) in listing.items():
        if shard in modules:
            modules[shard].setdefault(node_id.split("::")[0], []).append(node_id)
    assert len(modules["modules"]) > len(LONGEST_FIRST) and len(modules["session"]) > 1
    assert set(LONGEST_FIRST) <= set(modules["modules"])
    first = [*LONGEST_FIRST, *(name for name in modules["modules"] if name not in LONGEST_FIRST)]
    assert order == [
        *(node_id for name in first for node_id in modules["modules"][name]),
        *(node_id for name in reversed(list(modules["session"])) for node_id in modules["session"][name]),
    ]


def test_a_first_vm_shard_runs_before_a_shard_the_process_still_owns(
    listing: dict[str, tuple[str, set[str]]],
) -> None:
    """``--shard vm,modules``: the qemu host's tests first, then the module fleets' as their owner runs them
    (``LONGEST_FIRST`` first), not from the end as a borrowed shard's."""
    order = [line.split("::")[0] for line in collected("--shard", "vm,modules") if line.startswith("tests/")]
    vm = {node_id.split("::")[0] for node_id, (shard, _) in listing.items() if shard == "vm"}
    assert vm and set(order[: len([1 for _, (shard, _) in listing.items() if shard == "vm"])]) == vm
    later = list(dict.fromkeys(name for name in order if name not in vm or name in LONGEST_FIRST))
    assert later[: len(LONGEST_FIRST)] == list(LONGEST_FIRST)


@pytest.mark.parametrize("value", ["quick", "fast,fast", "fast,", ""])
def test_a_shard_list_naming_no_shard_is_refused(value: str) -> None:
    with pytest.raises(pytest.UsageError) as refused:
        shard_list(value)
    expected = f"--shard takes one or more of session, vm, modules, fast, comma-separated, got {value!r}"
    assert str(refused.value) == expected


def test_pytest_refuses_a_wrong_shard_list_before_collecting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--shard=fast,quick",
         "tests/unit/test_shards.py"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--shard takes one or more of session, vm, modules, fast, comma-separated, got 'fast,quick'" in result.stderr
