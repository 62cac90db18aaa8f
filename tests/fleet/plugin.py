"""pytest fixtures for the test fleet.

- ``fleet``: node1 (trixie, containerd 1.7), node2 (trixie), node3 (sid, containerd 2.1), booted
  with systemd-nspawn once per session;
- ``vm_fleet``: vm1 (trixie) under qemu, for tests that need a kernel of their own;
- ``fleet_factory(specs, name)``: any other fleet, e.g. ``[HostSpec("b1", "bookworm")]``;
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
from contextlib import ExitStack
from pathlib import Path

import pytest

from . import preflight
from .fleet import DEFAULT_HOSTS, Fleet, HostSpec
from .paths import cache_dir
from .roots import RootRecipe, ensure_root

SKIP_VARIABLE = "GPUNODE_SKIP_FLEET"

FleetFactory = Callable[[Sequence[HostSpec], str], Fleet]
Verify = Callable[..., subprocess.CompletedProcess[str]]


def require_fleet(vm: bool = False) -> None:
    """Fail (or, with GPUNODE_SKIP_FLEET=1, skip) the calling test when the fleet cannot run here."""
    try:
        preflight.check(vm=vm)
    except preflight.FleetUnavailable as error:
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(f"{SKIP_VARIABLE}=1 and the test fleet cannot run here: {error}")
        pytest.fail(f"the test fleet cannot run here: {error} (set {SKIP_VARIABLE}=1 to skip instead)")


@pytest.fixture(scope="session")
def fleet_factory() -> Iterator[FleetFactory]:
    booted: list[Fleet] = []
    with ExitStack() as session_locks:

        def make(specs: Sequence[HostSpec], name: str) -> Fleet:
            require_fleet(vm=any(spec.vm for spec in specs))
            # One test session at a time per fleet: another session's teardown must not pull hosts away.
            cache_dir().mkdir(parents=True, exist_ok=True)
            lock = session_locks.enter_context(open(cache_dir() / f"fleet-{name}.session.lock", "w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            fleet = Fleet(specs, name=name)
            if not fleet.is_up():
                booted.append(fleet)
            fleet.up()
            return fleet

        yield make
        for fleet in reversed(booted):
            fleet.down()


@pytest.fixture(scope="session")
def trixie_root() -> Path:
    """The cached Debian trixie root (containerd 1.7.24) that chroot tests lay writable copies over."""
    require_fleet()
    return ensure_root(RootRecipe("trixie"))


@pytest.fixture(scope="session")
def fleet(fleet_factory: FleetFactory) -> Fleet:
    return fleet_factory(DEFAULT_HOSTS, "default")


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
