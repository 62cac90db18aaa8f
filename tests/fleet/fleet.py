"""A fleet of test hosts: boot, reach over SSH, reset and tear down.

fleet = Fleet()            # node1 (trixie), node2 (trixie), node3 (sid), systemd-nspawn
fleet.up()                 # idempotent: boots only what is not running
fleet.run("node1", "systemctl is-active containerd")
fleet.reset(["node1"])     # fresh disk, same keys and machine-id (skipped while nothing used the fleet since boot)
fleet.down()               # idempotent: stops only what the harness started
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import access, budget, nspawn, preflight, processes, vm
from .archive import archive_host
from .identity import ensure_client_key, ensure_identity
from .paths import fleet_dir, key_path
from .processes import Recorded
from .roots import RootRecipe, ensure_root
from .state import STATE_FILE, HostState

log = logging.getLogger(__name__)

ARCHIVE_RELAY_FILE = "archive-relay.json"
BOOT_TIMEOUT = {False: 120.0, True: 300.0}  # seconds, by "is a VM"


@dataclass(frozen=True)
class HostSpec:
    name: str
    release: str
    vm: bool = False
    # A containerd line Debian does not ship (a key of tests.realbin.upstream.SOURCES): its build is bound
    # read-only over the root's containerd, ctr and runc shim, as a node upgraded to that line has them.
    containerd: str = ""


@dataclass(frozen=True)
class Host:
    name: str
    port: int
    release: str
    vm: bool


DEFAULT_HOSTS = (HostSpec("node1", "trixie"), HostSpec("node2", "trixie"), HostSpec("node3", "sid"))
# The tests' shared fleet: containerd 1.7.24 on node1 and node2 (Debian's), and on node3 2.3.4, the 2.3 LTS
# line built from source (the demo keeps Debian's 2.1.9 there: it needs no source).
TEST_HOSTS = (*DEFAULT_HOSTS[:2], HostSpec("node3", "sid", containerd="2.3.4"))


class Fleet:
    def __init__(self, specs: Sequence[HostSpec] = DEFAULT_HOSTS, name: str = "default") -> None:
        self.name = name
        self.specs = tuple(specs)
        self.directory = fleet_dir(name)
        # Hosts this object booted that no one can have reached yet: every way to a host (its access
        # files, ports, ``run``) empties the set for good, so a reset is skipped only where it would
        # give what the boot gave.
        self._untouched: set[str] = set()

    @property
    def inventory_path(self) -> Path:
        self._hand_out()
        return self.directory / "inventory.py"

    @property
    def ssh_config_path(self) -> Path:
        self._hand_out()
        return self.directory / "ssh_config"

    @property
    def known_hosts_path(self) -> Path:
        self._hand_out()
        return self.directory / "known_hosts"

    @property
    def key_path(self) -> Path:
        self._hand_out()
        return key_path()

    @property
    def hosts(self) -> list[Host]:
        self._hand_out()
        return [Host(s.name, s.port, s.release, s.vm) for s in self._states()]

    def host(self, name: str) -> Host:
        self._hand_out()
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in fleet {self.name!r}")

    def is_up(self) -> bool:
        states = {s.name: s for s in self._states()}
        return all(
            spec.name in states and _matches(states[spec.name], spec) and _is_running(states[spec.name])
            for spec in self.specs
        )

    def up(self) -> None:
        """Boot every host of the fleet that is not running, and write the access files."""
        preflight.check(vm=any(spec.vm for spec in self.specs))
        with self._locked():
            roots = self._build_roots()
            wanted = {spec.name: spec for spec in self.specs}
            for state in self._states():
                spec = wanted.get(state.name)
                if spec is None or not _matches(state, spec) or not _is_running(state):
                    self._remove_host(state)
            running = {state.name for state in self._states()}
            missing = [spec for spec in self.specs if spec.name not in running]
            to_boot = []
            if missing:
                nspawn_hosts = sum(not spec.vm for spec in self.specs)
                with budget.room_for(self.name, nspawn_hosts, self.directory.parent):
                    to_boot = [self._new_state(spec) for spec in missing]
            if any(not spec.vm for spec in self.specs):
                self._ensure_archive_relay()
            for state in to_boot:
                self._boot(state, roots[state.name])
            self._write_access_files()
            self._wait_ready(to_boot)
            self._untouched |= {state.name for state in to_boot}

    def down(self) -> None:
        """Stop every host the harness started for this fleet and remove its state."""
        if not self.directory.exists():
            return
        self._hand_out()
        with self._locked():
            _each(self._remove_host, self._states())
            self._stop_archive_relay()
            for path in self._access_files():
                path.unlink(missing_ok=True)
        shutil.rmtree(self.directory)

    def reset(self, names: Iterable[str]) -> None:
        """Reboot ``names`` with a fresh disk; they keep their SSH host keys, machine-id and port.

        Hosts booted by ``up()`` that nothing has reached since are left as they are: their disk is
        as fresh as a reset would make it."""
        wanted = set(names)
        with self._locked():
            states = [s for s in self._states() if s.name in wanted]
            unknown = wanted - {s.name for s in states}
            if unknown:
                raise KeyError(f"no hosts {sorted(unknown)} in fleet {self.name!r}")
            states = [s for s in states if not (s.name in self._untouched and _is_running(s))]
            if not states:
                return
            roots = self._build_roots()
            _each(_stop_and_wipe, states)
            for state in states:
                self._boot(state, roots[state.name])
            self._wait_ready(states)

    def run(self, name: str, command: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on host ``name`` over SSH (strict host keys); never raises on failure."""
        self._hand_out()
        return self._ssh(name, command, timeout)

    def _hand_out(self) -> None:
        self._untouched.clear()

    def _access_files(self) -> tuple[Path, Path, Path]:
        return self.directory / "inventory.py", self.directory / "ssh_config", self.directory / "known_hosts"

    def _ssh(self, name: str, command: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        ssh_config = self.directory / "ssh_config"
        return subprocess.run(
            ["ssh", "-F", str(ssh_config), name, command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _states(self) -> list[HostState]:
        if not self.directory.exists():
            return []
        return [HostState.load(p.parent) for p in sorted(self.directory.glob(f"*/{STATE_FILE}"))]

    def _new_state(self, spec: HostSpec) -> HostState:
        directory = self.directory / spec.name
        directory.mkdir(parents=True, exist_ok=True)
        ensure_identity(directory / "identity", spec.name)
        state = HostState(directory, spec.name, spec.release, spec.vm, _free_port(), containerd=spec.containerd)
        state.save()
        return state

    def _build_roots(self) -> dict[str, Path]:
        ensure_client_key()
        recipes = {spec.name: RootRecipe(spec.release, with_kernel=spec.vm) for spec in self.specs}
        unique = {recipe.name: recipe for recipe in recipes.values()}
        with ThreadPoolExecutor(max_workers=len(unique)) as pool:
            built = dict(zip(unique, pool.map(ensure_root, unique.values()), strict=True))
        return {host: built[recipe.name] for host, recipe in recipes.items()}

    def _boot(self, state: HostState, root: Path) -> None:
        if state.vm:
            vm.boot(state, root)
        else:
            nspawn.boot(state, root, self.directory / "archive.sock")

    def _remove_host(self, state: HostState) -> None:
        _stop(state)
        nspawn.unmount_all_under(state.directory)
        subprocess.run(["rm", "-rf", "--one-file-system", str(state.directory)], check=True)

    def _ensure_archive_relay(self) -> None:
        relay_file = self.directory / ARCHIVE_RELAY_FILE
        if relay_file.exists() and processes.is_running(Recorded.from_json(relay_file.read_text())):
            return
        relay = processes.start(
            "archive-relay",
            [
                "socat",
                f"UNIX-LISTEN:{self.directory / 'archive.sock'},fork,unlink-early",
                f"TCP:{archive_host()}:80",
            ],
            self.directory / "archive-relay.log",
        )
        relay_file.write_text(relay.to_json())

    def _stop_archive_relay(self) -> None:
        relay_file = self.directory / ARCHIVE_RELAY_FILE
        if relay_file.exists():
            processes.stop([Recorded.from_json(relay_file.read_text())])
            relay_file.unlink()

    def _write_access_files(self) -> None:
        states = self._states()
        inventory, ssh_config, known_hosts = self._access_files()
        access.write_known_hosts(known_hosts, states)
        access.write_ssh_config(ssh_config, states, key_path(), known_hosts)
        access.write_inventory(inventory, states, key_path(), known_hosts)

    def _wait_ready(self, states: Sequence[HostState]) -> None:
        if not states:
            return
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(states)) as pool:
            list(pool.map(self._wait_host_ready, states))
        log.info("%s ready in %.1f s", ", ".join(s.name for s in states), time.monotonic() - started)

    def _wait_host_ready(self, state: HostState) -> None:
        timeout = BOOT_TIMEOUT[state.vm]
        deadline = time.monotonic() + timeout
        while True:
            if not _is_running(state):
                raise RuntimeError(f"{state.name} stopped while booting:\n{_console_tail(state)}")
            result = self._ssh(state.name, "systemctl is-system-running --wait", timeout=timeout)
            if result.stdout.strip() == "running":
                break
            if result.stdout.strip() == "degraded":
                failed = self._ssh(state.name, "systemctl --failed --plain --no-legend").stdout
                raise RuntimeError(f"{state.name} booted degraded; failed units:\n{failed}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{state.name} not ready: {result.stderr.strip()}\n{_console_tail(state)}")
            time.sleep(0.3)
        active = self._ssh(state.name, "systemctl is-active containerd").stdout.strip()
        if active != "active":
            raise RuntimeError(f"{state.name}: containerd is {active!r} after boot")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory.parent / f"{self.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _stop(state: HostState) -> None:
    (vm if state.vm else nspawn).stop(state)


def _stop_and_wipe(state: HostState) -> None:
    _stop(state)
    (vm if state.vm else nspawn).wipe_disk(state)


def _each(action: Callable[[HostState], None], states: Sequence[HostState]) -> None:
    """``action`` on every host at once (stopping a host mostly waits for its shutdown)."""
    if states:
        with ThreadPoolExecutor(max_workers=len(states)) as pool:
            list(pool.map(action, states))


def _matches(state: HostState, spec: HostSpec) -> bool:
    return (state.release, state.vm, state.containerd) == (spec.release, spec.vm, spec.containerd)


def _is_running(state: HostState) -> bool:
    return bool(state.processes) and all(processes.is_running(p) for p in state.processes)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _console_tail(state: HostState) -> str:
    console = state.directory / "console.log"
    return console.read_text(errors="replace")[-2000:] if console.exists() else "(no console output)"
