"""``tests/claims.py``: two pytest processes given one claims directory run every test of a selection once
between them, each module whole in one process, and both take part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The first test of each module waits (at most 60 s) until both processes run a test: neither can take
# every module before the other starts.
MODULE = """\
import os, time

def test_first():
    with open(os.environ["STARTED"], "a") as started:
        started.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 60
    while len(set(open(os.environ["STARTED"]).read().split())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(os.environ["RAN"], "a") as ran:
        ran.write(f"{os.getpid()} {__name__}.first\\n")

def test_second():
    with open(os.environ["RAN"], "a") as ran:
        ran.write(f"{os.getpid()} {__name__}.second\\n")
"""


def test_two_processes_share_the_modules_each_run_once_and_whole(tmp_path: Path) -> None:
    suite, claims, ran = tmp_path / "suite", tmp_path / "claims", tmp_path / "ran"
    suite.mkdir()
    claims.mkdir()
    names = [f"test_module_{number}" for number in range(8)]
    for name in names:
        (suite / f"{name}.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAN": str(ran), "STARTED": str(tmp_path / "started")}
    argv = [sys.executable, "-m", "pytest", "-p", "tests.claims", f"--claim-modules={claims}", "-q",
            "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)]  # fmt: skip
    processes = [
        subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    lines = [line.split() for line in ran.read_text().splitlines()]
    tests = sorted(test for _, test in lines)
    assert tests == sorted(f"{name}.{test}" for name in names for test in ("first", "second")), tests
    by_module: dict[str, set[str]] = {}
    for pid, test in lines:
        by_module.setdefault(test.split(".")[0], set()).add(pid)
    assert all(len(pids) == 1 for pids in by_module.values()), by_module
    assert len({pid for pid, _ in lines}) == 2, "one process ran every module"
    assert sorted(path.name for path in claims.iterdir()) == sorted(f"{name}.py" for name in names)


# Each module holds a test of each claim group; each test waits (at most 60 s) until both processes run a
# test, so that both claim modules.
MIXED = """\
import os, time
import pytest

def ran(name):
    with open(os.environ["STARTED"], "a") as started:
        started.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 60
    while len(set(open(os.environ["STARTED"]).read().split())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(os.environ["RAN"], "a") as ran:
        ran.write(f"{os.getpid()} {__name__}.{name}\\n")

@pytest.mark.other
def test_other():
    ran("other")

def test_plain():
    ran("plain")
"""
CONFTEST = """\
from tests.claims import CLAIM_GROUP

def pytest_configure(config):
    config.addinivalue_line("markers", "other: a test of the other claim group")

def pytest_collection_modifyitems(items):
    for item in items:
        item.stash[CLAIM_GROUP] = "other" if item.get_closest_marker("other") else "plain"
"""


def test_processes_selecting_different_tests_lose_none(tmp_path: Path) -> None:
    """One process selects only the ``other`` group, the other every test: a module is claimed once per
    group, so the plain tests of a module the first claimed for its own still run in the second."""
    suite, claims, ran = tmp_path / "suite", tmp_path / "claims", tmp_path / "ran"
    suite.mkdir()
    claims.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    names = [f"test_module_{number}" for number in range(6)]
    for name in names:
        (suite / f"{name}.py").write_text(MIXED)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAN": str(ran), "STARTED": str(tmp_path / "started")}
    argv = [sys.executable, "-m", "pytest", "-p", "tests.claims", f"--claim-modules={claims}", "-q",
            "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)]  # fmt: skip
    processes = [
        subprocess.Popen(
            argv + selection, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for selection in (["-m", "other"], [])
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    lines = [line.split() for line in ran.read_text().splitlines()]
    tests = sorted(test for _, test in lines)
    assert tests == sorted(f"{name}.{test}" for name in names for test in ("other", "plain")), outputs
    assert len({pid for pid, _ in lines}) == 2, "one process ran every module"
