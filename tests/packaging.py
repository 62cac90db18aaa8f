"""The package built from the checkout, once per test run, for the tests of what it ships.

setuptools builds in the checkout's ``build/`` folder, so every build of the checkout during the
tests (the shared wheel here, ``pip install <checkout>`` elsewhere) holds ``build_lock()``; with
pytest-xdist the workers share one wheel, built by whichever needs it first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def build_lock() -> Iterator[None]:
    """Held while anything builds the checkout."""
    (REPO / "build").mkdir(exist_ok=True)
    with open(REPO / "build" / ".tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path  # pyinfra_gpunode-*.whl, built without build isolation by this environment's setuptools
    site: Path  # the wheel installed there with ``pip install --no-deps --target``


def _run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run that every xdist worker sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """The checkout's wheel and its plain install, shared by the tests of this run (do not change them)."""
    directory = _run_directory(tmp_path_factory) / "wheel"
    site = directory / "site"
    with build_lock():
        if not site.is_dir():
            pip = [sys.executable, "-m", "pip"]
            dist = directory / "dist"
            subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, REPO], check=True)
            (wheel,) = dist.glob("pyinfra_gpunode-*.whl")
            unfinished = directory / "site.partial"
            shutil.rmtree(unfinished, ignore_errors=True)
            subprocess.run([*pip, "install", "-q", "--no-deps", "--target", unfinished, wheel], check=True)
            unfinished.rename(site)
    (wheel,) = (directory / "dist").glob("pyinfra_gpunode-*.whl")
    return InstalledWheel(wheel, site)
