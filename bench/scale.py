"""Scale: deploys/gpu_node.py on 30 nspawn hosts and on 3, in the same run, each figure with its 30/3 ratio.

    .venv/bin/python bench/scale.py [--runs 3] [--hosts 30]     # as root; not in CI (minutes)

Boots two fleets of its own (``scale-small``: sm1..sm3, ``scale-big``: sb01..sb30, trixie, ~50 MB
each), raises ``fs.inotify.max_user_instances`` for the run when it is below 8192 (restored at the
end) and tears both fleets down at the end. Per fleet, measurements interleaved between the two:

- first rollout: the first ``-y`` run on fresh hosts (writes the files, restarts containerd node by
  node): the rollout (its serial operation's start to the rollout summary) against its budget, the
  sum of bare restart-until-CRI times + 1 s per node, and the whole run's wall time;
- first rollout in batches: the same on hosts made fresh again, with ``gpunode_rollout_batch``
  ``--batch`` (default 5) against batch 1 (target: the whole run <= 0.3x of batch 1's);
- restart-only turns: the config touched on every node (a restart pending, nothing to write), the same;
- no-op run (target <= 1.5x pyinfra's one-operation floor, ``exec -- true``, on the same hosts);
- facts pass (``--dry`` without ``-y``: every operation reads its facts, nothing runs);
- remote commands per host in a no-op run (target <= 2), by first command line;
- controller memory: peak RSS of the pyinfra process of each kind of run.

Medians of ``--runs`` (the first rollout happens once per fleet); the machine's load average is
printed beside the figures, since other work on the machine moves them.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rollout import PYINFRA, _restart_to_ready  # noqa: E402

from tests.fleet.fleet import Fleet, HostSpec  # noqa: E402

INOTIFY = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_FOR_RUN = 8192
DEPLOY = ("-y", "INVENTORY", "deploys/gpu_node.py")
FACTS_PASS = ("--dry", "INVENTORY", "deploys/gpu_node.py")  # without -y: every operation reads its facts
COMMAND = re.compile(r"Running command on (\S+): \(pty=\w+\) (.*)")
ROLLOUT_STARTS = "--> Starting serial operation:"
ROLLOUT_ENDS = "--> Summary (rollout order)"


def pyinfra(fleet: Fleet, *args: str) -> tuple[float, int, str, float]:
    """``pyinfra ARGS`` with ``INVENTORY`` replaced by the fleet's inventory: wall seconds, peak RSS (MiB)
    of the pyinfra process, its output, and the rollout's seconds (its serial operation's start to the
    rollout summary; 0 without one); a failed run stops the bench."""
    command = [PYINFRA, *(str(fleet.inventory_path) if arg == "INVENTORY" else arg for arg in args)]
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # lines as they happen, for the rollout's span
    )  # fmt: skip
    assert process.stdout is not None
    lines, marks = [], {}
    for line in process.stdout:  # timed as it comes: the rollout's own span
        lines.append(line)
        for mark, text in (("rollout", ROLLOUT_STARTS), ("summary", ROLLOUT_ENDS)):
            if text in line and mark not in marks:
                marks[mark] = time.monotonic()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.monotonic() - started
    output = "".join(lines)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-5000:]}")
    rollout = marks["summary"] - marks["rollout"] if len(marks) == 2 else 0.0
    return elapsed, usage.ru_maxrss // 1024, output, rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions per figure (median reported)")
    parser.add_argument("--hosts", type=int, default=30, help="hosts in the big fleet")
    parser.add_argument("--batch", type=int, default=5, help="gpunode_rollout_batch of the batched first rollout")
    args = parser.parse_args()
    small = Fleet([HostSpec(f"sm{i}", "trixie") for i in range(1, 4)], name="scale-small")
    big = Fleet([HostSpec(f"sb{i:02d}", "trixie") for i in range(1, args.hosts + 1)], name="scale-big")
    with _inotify_raised(), _booted(small, big):
        print(f"load average at start: {_load()}", flush=True)
        results = {fleet.name: _measure(fleet, args.runs, args.batch) for fleet in (small, big)}
        print(f"load average at end:   {_load()}")
    _print(results[small.name], results[big.name], len(small.specs), len(big.specs))


def _measure(fleet: Fleet, runs: int, batch: int) -> dict[str, object]:
    names = [spec.name for spec in fleet.specs]
    started = time.monotonic()
    result: dict[str, object] = {}
    rss: dict[str, int] = {}

    def run(kind: str, *args: str) -> tuple[float, str, float]:
        elapsed, peak, output, rollout = pyinfra(fleet, *args)
        rss[kind] = max(rss.get(kind, 0), peak)
        return elapsed, output, rollout

    restarts = sum(_restart_to_ready(fleet, name) for name in names)
    wall, _, rollout = run("first rollout", *DEPLOY)
    result["first"] = (wall, rollout, restarts)
    fleet.reset(names)  # fresh again: the batched first rollout writes everything too
    wall, _, rollout = run("first, batches", "--data", f"gpunode_rollout_batch={batch}", *DEPLOY)
    result["batched"] = (wall, rollout, batch)
    result["noop"] = statistics.median(run("no-op", *DEPLOY)[0] for _ in range(runs))
    result["floor"] = statistics.median(run("floor", "-y", "INVENTORY", "exec", "--", "true")[0] for _ in range(runs))
    result["facts"] = statistics.median(run("facts pass", *FACTS_PASS)[0] for _ in range(runs))
    result["commands"] = _commands(run("no-op --debug", "--debug", *DEPLOY)[1], names)
    turns = []
    for _ in range(runs):
        restarts = sum(_restart_to_ready(fleet, name) for name in names)
        for name in names:  # config newer than the daemon: every node's restart is pending
            fleet.run(name, "touch /etc/containerd/config.toml")
        wall, _, rollout = run("restart-only", *DEPLOY)
        turns.append((wall, rollout, restarts))
    result["restart"] = sorted(turns, key=lambda turn: turn[1] - turn[2])[len(turns) // 2]
    result["rss"] = rss
    print(f"{fleet.name}: measured in {time.monotonic() - started:.0f} s", flush=True)
    return result


def _commands(debug_log: str, names: list[str]) -> dict[str, Counter[str]]:
    """Per host: each remote command's first 60 characters, counted."""
    found: dict[str, Counter[str]] = {name: Counter() for name in names}
    for host, command in COMMAND.findall(debug_log):
        if host in found:
            found[host][command[:60]] += 1
    return found


def _print(small: dict, big: dict, n_small: int, n_big: int) -> None:
    def line(label: str, key: str, note: str = "") -> None:
        print(f"{label:<28}{small[key]:7.2f} s {big[key]:7.2f} s   x{big[key] / small[key]:4.2f}   {note}")

    print(f"\n{'':<28}{n_small:>7} h  {n_big:>7} h   ratio")
    line("pyinfra one-op floor", "floor")
    line("no-op run", "noop", "target 30/3 <= 2x")
    print(
        f"{'  no-op / floor':<28}{small['noop'] / small['floor']:7.2f} x {big['noop'] / big['floor']:7.2f} x"
        "           target <= 1.5x"
    )
    line("facts pass (--dry)", "facts")
    for key, label in (("first", "first rollout"), ("restart", "restart-only turns")):
        cells, walls = [], []
        for result, n in ((small, n_small), (big, n_big)):
            wall, rollout, restarts = result[key]
            cells.append(f"{rollout:6.1f} s / budget {restarts + n:5.1f} s ({(rollout - restarts) / n:4.2f} s/node)")
            walls.append(f"{wall:6.1f} s")
        print(f"{label:<28}{cells[0]}   {cells[1]}   target <= budget (restarts + 1 s/node)")
        print(f"{'  whole run':<28}{walls[0]:>45}   {walls[1]}")
    for result, n in ((small, n_small), (big, n_big)):
        (wall, rollout, _), (b_wall, b_rollout, batch) = result["first"], result["batched"]
        print(
            f"first rollout, {n} hosts, batch {batch} / batch 1: whole run {b_wall:6.1f} s / {wall:6.1f} s = "
            f"x{b_wall / wall:4.2f}, rollout {b_rollout:6.1f} s / {rollout:6.1f} s = x{b_rollout / rollout:4.2f}"
            "   target whole run <= 0.3x"
        )
    for result, n in ((small, n_small), (big, n_big)):
        counts = [sum(counter.values()) for counter in result["commands"].values()]
        print(f"remote commands per host, no-op, {n} hosts: min {min(counts)} max {max(counts)}   target <= 2")
    first = next(iter(small["commands"].values()))
    for command, count in first.most_common():
        print(f"    {count} x {command}")
    for kind in small["rss"]:
        print(f"controller peak RSS {kind:<16}{small['rss'][kind]:5d} MiB {big['rss'][kind]:5d} MiB")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextmanager
def _inotify_raised() -> Iterator[None]:
    before = int(INOTIFY.read_text())
    if before < INOTIFY_FOR_RUN:
        print(f"fs.inotify.max_user_instances {before} -> {INOTIFY_FOR_RUN} for the run", flush=True)
        INOTIFY.write_text(f"{INOTIFY_FOR_RUN}\n")
    try:
        yield
    finally:
        if before < INOTIFY_FOR_RUN:
            INOTIFY.write_text(f"{before}\n")
            print(f"fs.inotify.max_user_instances restored to {before}")


@contextmanager
def _booted(*fleets: Fleet) -> Iterator[None]:
    try:
        for fleet in fleets:
            started = time.monotonic()
            fleet.down()  # fresh hosts: the first rollout writes everything
            fleet.up()
            print(f"{fleet.name}: {len(fleet.specs)} hosts up in {time.monotonic() - started:.0f} s", flush=True)
        yield
    finally:
        for fleet in reversed(fleets):
            fleet.down()


if __name__ == "__main__":
    main()
