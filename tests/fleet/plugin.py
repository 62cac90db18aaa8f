"""pytest fixtures for the test fleet.

- ``fleet``: node1 (trixie, containerd 1.7), node2 (trixie), node3 (sid, containerd 2.3.4 built from source), booted
  with systemd-nspawn once per session;
- ``vm_fleet``: vm1 (trixie) under qemu, for tests that need a kernel of their own;
- ``fleet_factory(specs, name)``: any other fleet, e.g. ``[HostSpec("b1", "bookworm")]``, up for the
  session; ``with fleet_factory.lent(specs, name) as fleet:`` one a module uses alone, down after it;
- ``verify(fleet, checks, hosts)``: run the shipped verification suite (``pyinfra_gpunode.verify``) against a fleet.

A fleet that was already up when the session started (``python -m tests.fleet up``) is used and
left up; one the session booted is torn down at its end. A machine that cannot run the fleet
fails the tests that need it, with the reason, unless ``GPUNODE_SKIP_FLEET=1`` is set.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from . import preflight
from .fleet import TEST_HOSTS, Fleet, HostSpec
from .paths import cache_dir
from .roots import RootRecipe, ensure_root

SKIP_VARIABLE = "GPUNODE_SKIP_FLEET"

Verify = Callable[..., subprocess.CompletedProcess[str]]


def require_fleet(vm: bool = False) -> None:
    """Fail (or, with GPUNODE_SKIP_FLEET=1, skip) the calling test when the fleet cannot run here."""
    try:
        preflight.check(vm=vm)
    except preflight.FleetUnavailable as error:
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(f"{SKIP_VARIABLE}=1 and the test fleet cannot run here: {error}")
        pytest.fail(f"the test fleet cannot run here: {error} (set {SKIP_VARIABLE}=1 to skip instead)")


class FleetFactory:
    """Boots fleets for the session. ``factory(specs, name)`` keeps a fleet up until the session ends;
    ``with factory.lent(specs, name) as fleet:`` takes down at the end of the block a fleet it booted,
    so that a module's own fleet does not hold hosts (and the machine's inotify instances) for the rest
    of the session. A fleet that was up before (``python -m tests.fleet up``) is left up either way."""

    def __init__(self, session_locks: ExitStack) -> None:
        self._session_locks = session_locks
        self._locked: set[str] = set()
        self._booted: list[Fleet] = []

    def __call__(self, specs: Sequence[HostSpec], name: str) -> Fleet:
        fleet = self._fleet(specs, name)
        if not fleet.is_up():
            self._booted.append(fleet)
        fleet.up()
        return fleet

    @contextmanager
    def lent(self, specs: Sequence[HostSpec], name: str) -> Iterator[Fleet]:
        fleet = self._fleet(specs, name)
        booted = not fleet.is_up()
        try:
            fleet.up()
            yield fleet
        finally:
            if booted:
                fleet.down()

    def close(self) -> None:
        for fleet in reversed(self._booted):
            fleet.down()

    def _fleet(self, specs: Sequence[HostSpec], name: str) -> Fleet:
        require_fleet(vm=any(spec.vm for spec in specs))
        if name not in self._locked:
            # One test session at a time per fleet: another session's teardown must not pull hosts away.
            cache_dir().mkdir(parents=True, exist_ok=True)
            lock = self._session_locks.enter_context(open(cache_dir() / f"fleet-{name}.session.lock", "w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._locked.add(name)
        return Fleet(specs, name=name)


@pytest.fixture(scope="session")
def fleet_factory() -> Iterator[FleetFactory]:
    with ExitStack() as session_locks:
        factory = FleetFactory(session_locks)
        try:
            yield factory
        finally:
            factory.close()


@pytest.fixture(scope="session")
def trixie_root() -> Path:
    """The cached Debian trixie root (containerd 1.7.24) that chroot tests lay writable copies over."""
    require_fleet()
    return ensure_root(RootRecipe("trixie"))


@pytest.fixture(scope="session")
def fleet(fleet_factory: FleetFactory) -> Fleet:
    return fleet_factory(TEST_HOSTS, "default")


@pytest.fixture(scope="session")
def vm_fleet(fleet_factory: FleetFactory) -> Fleet:
    return fleet_factory([HostSpec("vm1", "trixie", vm=True)], "vm")


@pytest.fixture(scope="session")
def verify(tmp_path_factory: pytest.TempPathFactory) -> Verify:
    """Run the installed ``pyinfra_gpunode.verify`` against a fleet in a pytest of its own, started outside
    the checkout as a user would; returns the finished process."""
    outside = tmp_path_factory.mktemp("verify-cwd")

    def run(
        fleet: Fleet, checks: str = "containerd", hosts: Sequence[str] = (), python: str = sys.executable
    ) -> subprocess.CompletedProcess[str]:
        selection = ["-k", " or ".join(f"[{name}]" for name in hosts)] if hosts else []
        command = [
            python,
            "-m",
            "pytest",
            "--pyargs",
            "pyinfra_gpunode.verify",
            "--inventory",
            str(fleet.inventory_path),
            f"--gpunode-checks={checks}",
            "-p",
            "no:cacheprovider",
            "-v",
            *selection,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=outside)

    return run
