"""``tests/claims.py``: two pytest processes given one claims directory run every test of a selection once
between them, each module whole in one process, and both take part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# ``ran(name, wait=True)`` waits (at most 60 s) until both processes run a test: neither can take every
# module before the other starts.
RAN = """\
import os, time
import pytest

def ran(name, wait=True):
    with open(os.environ["STARTED"], "a") as started:
        started.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 60
    while wait and len(set(open(os.environ["STARTED"]).read().split())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(os.environ["RAN"], "a") as ran:
        ran.write(f"{os.getpid()} {__name__}.{name}\\n")
"""
MODULE = (
    RAN
    + """
def test_first():
    ran("first")

def test_second():
    ran("second", wait=False)
"""
)
# A test of each claim group in each module.
MIXED = (
    RAN
    + """
@pytest.mark.other
def test_other():
    ran("other")

def test_plain():
    ran("plain")
"""
)
CONFTEST = """\
from tests.claims import CLAIM_GROUP

def pytest_configure(config):
    config.addinivalue_line("markers", "other: a test of the other claim group")

def pytest_collection_modifyitems(items):
    for item in items:
        item.stash[CLAIM_GROUP] = "other" if item.get_closest_marker("other") else "plain"
"""


def run_two(tmp_path: Path, module: str, names: list[str], selections: tuple[list[str], list[str]]) -> list[list[str]]:
    """Two pytest processes sharing one claims directory over a suite of ``names``, each a copy of
    ``module``, with ``selections`` added to their arguments: ``[pid, module.test]`` for each test run."""
    suite, claims, ran = tmp_path / "suite", tmp_path / "claims", tmp_path / "ran"
    suite.mkdir()
    claims.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name in names:
        (suite / f"{name}.py").write_text(module)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAN": str(ran), "STARTED": str(tmp_path / "started")}
    argv = [sys.executable, "-m", "pytest", "-p", "tests.claims", f"--claim-modules={claims}", "-q",
            "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)]  # fmt: skip
    processes = [
        subprocess.Popen(
            argv + selection, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for selection in selections
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    return [line.split() for line in ran.read_text().splitlines()]


def test_two_processes_share_the_modules_each_run_once_and_whole(tmp_path: Path) -> None:
    names = [f"test_module_{number}" for number in range(8)]
    lines = run_two(tmp_path, MODULE, names, ([], []))
    tests = sorted(test for _, test in lines)
    assert tests == sorted(f"{name}.{test}" for name in names for test in ("first", "second")), tests
    by_module: dict[str, set[str]] = {}
    for pid, test in lines:
        by_module.setdefault(test.split(".")[0], set()).add(pid)
    assert all(len(pids) == 1 for pids in by_module.values()), by_module
    assert len({pid for pid, _ in lines}) == 2, "one process ran every module"
    claimed = sorted(path.name for path in (tmp_path / "claims").iterdir())
    assert claimed == sorted(f"plain:{name}.py" for name in names)


def test_processes_selecting_different_tests_lose_none(tmp_path: Path) -> None:
    """One process selects only the ``other`` group, the other every test: a module is claimed once per
    group, so the plain tests of a module the first claimed for its own still run in the second."""
    names = [f"test_module_{number}" for number in range(6)]
    lines = run_two(tmp_path, MIXED, names, (["-m", "other"], []))
    tests = sorted(test for _, test in lines)
    assert tests == sorted(f"{name}.{test}" for name in names for test in ("other", "plain")), tests
    assert len({pid for pid, _ in lines}) == 2, "one process ran every module"
