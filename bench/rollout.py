"""Benchmark deploys/gpu_node.py on the test fleet, each figure beside a floor measured in the same run.

    .venv/bin/python bench/rollout.py [--runs 3]

- no-op re-run wall time vs pyinfra running one trivial operation on the same fleet (target <= 1.3x);
- remote commands per host in a no-op run (target 1);
- a restart-only turn's time per node beyond a bare ``systemctl restart containerd`` until the CRI plugin
  reports (target <= 0.5 s);
- the readiness report (deploys/readiness.py) on the converged fleet: its wall time vs the same floor
  (target <= 1.5x), and its remote commands per host (target 1).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fleet.fleet import DEFAULT_HOSTS, Fleet  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
CRI_STARTED = (
    "systemctl restart containerd && id=$(systemctl show -p InvocationID --value containerd) && "
    'until journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" | '
    "grep -qE 'Start cri plugin with config|starting cri plugin'; do sleep 0.05; done"
)


def timed(command: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    return elapsed, result.stdout + result.stderr


def deploy(fleet: Fleet, *args: str) -> tuple[float, str]:
    return timed([PYINFRA, "-y", *args, str(fleet.inventory_path), "deploys/gpu_node.py"])


def report(fleet: Fleet, *args: str) -> tuple[float, str]:
    """deploys/readiness.py; it exits non-zero (and the bench stops) when a node is not ready."""
    return timed([PYINFRA, "-y", *args, str(fleet.inventory_path), "deploys/readiness.py"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions per figure (median reported)")
    runs = parser.parse_args().runs

    fleet = Fleet(DEFAULT_HOSTS)
    booted = not fleet.is_up()
    fleet.up()
    names = [spec.name for spec in DEFAULT_HOSTS]
    try:
        fleet.reset(names)
        deploy(fleet)  # converge first

        noop = statistics.median(deploy(fleet)[0] for _ in range(runs))
        floor = statistics.median(
            timed([PYINFRA, "-y", str(fleet.inventory_path), "exec", "--", "true"])[0] for _ in range(runs)
        )
        debug_log = deploy(fleet, "--debug")[1]
        commands = Counter(re.findall(r"Running command on (\S+):", debug_log))
        readiness = statistics.median(report(fleet)[0] for _ in range(runs))
        readiness_commands = Counter(re.findall(r"Running command on (\S+):", report(fleet, "--debug")[1]))

        overheads = []
        for _ in range(runs):
            restart_floor = sum(_restart_to_ready(fleet, name) for name in names)
            for name in names:  # config newer than the daemon: every node's restart is pending
                fleet.run(name, "touch /etc/containerd/config.toml")
            rollout = deploy(fleet)[0] - noop
            overheads.append((rollout - restart_floor) / len(names))
        overhead = statistics.median(overheads)
    finally:
        if booted:
            fleet.down()

    print(
        f"no-op re-run         {noop:6.2f} s   floor (one trivial op) {floor:5.2f} s   "
        f"ratio {noop / floor:4.2f}x   target <= 1.3x"
    )
    for name in names:
        print(f"remote commands      {commands[name]:6d}     on {name} in a no-op run              target 1")
    print(f"rollout beyond floor {overhead:6.2f} s per node (restart-to-CRI floor subtracted)    target <= 0.5 s")
    print(
        f"readiness report     {readiness:6.2f} s   floor (one trivial op) {floor:5.2f} s   "
        f"ratio {readiness / floor:4.2f}x   target <= 1.5x"
    )
    for name in names:
        print(
            f"remote commands      {readiness_commands[name]:6d}     on {name} in the readiness report       target 1"
        )


def _restart_to_ready(fleet: Fleet, name: str) -> float:
    """A bare restart until the CRI plugin reports, less one SSH round trip."""
    started = time.monotonic()
    fleet.run(name, "true")
    round_trip = time.monotonic() - started
    started = time.monotonic()
    result = fleet.run(name, CRI_STARTED)
    if result.returncode != 0:
        raise SystemExit(f"{name}: bare restart failed: {result.stderr}")
    return time.monotonic() - started - round_trip


if __name__ == "__main__":
    main()
