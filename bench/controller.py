"""Controller: deploys/gpu_node.py's controller alone over 1,000 and 5,000 simulated nodes, beside pyinfra's floor.

    .venv/bin/python bench/controller.py [--node plain|gpu] [--nodes 1000,5000] [--runs 1] [--profile]
    .venv/bin/python bench/controller.py [--node plain|gpu] --record   # as root: boots one test host, ~30 s

Every node answers through ``ReplayConnector`` (bench/replay.py) from the recorded answers of one real,
converged test host (``bench/recordings/trixie-converged.json``; with ``--node gpu``, a GPU node's,
``trixie-gpu-converged.json``, whose driver, toolkit and CDI steps are in the no-op too): no SSH, no
containers, nothing runs anywhere but in the controller. Per node count, each configuration runs as the
``pyinfra`` command in a fresh process, measured by ``wait4``: CPU seconds (user + system) and peak RSS,
each also per node:

- no-op run: ``pyinfra -y INVENTORY deploys/gpu_node.py`` on converged nodes (one command per node);
- dry-run plan: ``pyinfra --dry INVENTORY deploys/gpu_node.py``;
- floor: ``pyinfra -y INVENTORY bench/one_operation.py``, one trivial operation (``server.shell``
  running ``true``) from a deploy file, over the same connector;
- exec: ``pyinfra -y INVENTORY exec -- true``, bench/scale.py's floor, for reference (no deploy file).

Targets, each printed as a ratio with PASS or MISS: the no-op run's and the dry run's CPU per node <= 2x
the floor's, their peak memory per node <= 2x the floor's, and the largest node count's figures <= 1.1x
linear from the smallest (5,000 nodes <= 5.5x the 1,000-node figures). A kind that misses a target is
profiled (cProfile, at the smallest node count; ``--profile``: both kinds at the largest): this project's
top 25 functions by cumulative time, and each library's share of the time. Medians of ``--runs``; the
machine's load average is printed beside the figures (CPU seconds move less with it than wall time).

``--record`` boots one trixie test host (fleet ``ctlbench-rec``, host ``ctlrec1``; no GPU, or with
``--node gpu`` a preinstalled driver's GPU node planted as the fleet tests plant it), converges it with
``pyinfra -y deploys/gpu_node.py`` over SSH, runs the configurations above against it through
``RecordingConnector`` and writes every command's answer (and whether the node was ready) to the
recordings file, then tears it down.
A command the recordings lack stops the bench naming it: record again after a fact's command changed.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from replay import Answer, RecordingConnector, ReplayConnector, load, save, use_connector  # noqa: E402

RECORDINGS = {
    "plain": REPO / "bench" / "recordings" / "trixie-converged.json",
    "gpu": REPO / "bench" / "recordings" / "trixie-gpu-converged.json",
}
KINDS = {
    "no-op": ("-y", "INVENTORY", "deploys/gpu_node.py"),
    "dry run": ("--dry", "INVENTORY", "deploys/gpu_node.py"),
    "floor": ("-y", "INVENTORY", "bench/one_operation.py"),
    "exec": ("-y", "INVENTORY", "exec", "--", "true"),
}
FLOORS = ("floor", "exec")  # one command per node, which succeeds
RECORD_FLEET, RECORD_HOST = "ctlbench-rec", "ctlrec1"
GPU_NODES = {
    "plain": "no GPU",
    "gpu": "an H100 planted with a preinstalled 550.163.01 driver as tests/integration/gpu_state.py plants it",
}
UNRECORDED = "UNRECORDED COMMAND:"
OWN = "pyinfra_gpunode"
OWN_DIRECTORIES = ("gpunode", "facts", "operations", "deploys", "verify")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000", help="node counts, comma-separated (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=1, help="repetitions per figure (median reported)")
    parser.add_argument("--profile", action="store_true", help="profile the largest count's no-op run and dry run")
    parser.add_argument("--record", action="store_true", help="record the answers of a real converged test host")
    parser.add_argument("--node", choices=sorted(RECORDINGS), default="plain", help="the recording nodes answer from")
    args = parser.parse_args()
    recording = RECORDINGS[args.node]
    if args.record:
        record(args.node)
        return
    counts = sorted({int(count) for count in args.nodes.split(",")})
    for directory in OWN_DIRECTORIES:  # as installed: pyinfra's CLI writes no bytecode, every run would compile
        compileall.compile_dir(REPO / directory, quiet=1)
    print(f"{args.node} nodes ({recording.relative_to(REPO)}); load average at start: {_load()}", flush=True)
    results: dict[tuple[str, int], list[Usage]] = {}
    with tempfile.TemporaryDirectory(prefix="ctlbench-") as scratch:
        for _ in range(args.runs):  # interleaved, so that a change in the machine's load touches every figure
            for count in counts:
                for kind in KINDS:
                    usage = measure(kind, count, Path(scratch), recording)
                    results.setdefault((kind, count), []).append(usage)
                    print(f"{kind:<8}{count:>6} nodes: {usage.cpu:7.1f} s CPU, {usage.rss_mib:6.1f} MiB peak RSS, "
                          f"{usage.wall:6.1f} s wall", flush=True)  # fmt: skip
        print(f"load average at end:   {_load()}")
        medians = {key: Usage.median(runs) for key, runs in results.items()}
        missed = _print(medians, counts)
        if args.profile or missed:
            for kind in ("no-op", "dry run"):
                if args.profile or kind in missed:
                    _profile(kind, counts[-1] if args.profile else counts[0], Path(scratch), recording)


@dataclass(frozen=True)
class Usage:
    """One configuration's run: CPU seconds (user + system), peak RSS (KiB) and wall seconds."""

    cpu: float
    rss_kib: int
    wall: float

    @property
    def rss_mib(self) -> float:
        return self.rss_kib / 1024

    @staticmethod
    def median(runs: list[Usage]) -> Usage:
        return Usage(
            statistics.median(run.cpu for run in runs),
            int(statistics.median(run.rss_kib for run in runs)),
            statistics.median(run.wall for run in runs),
        )


def measure(kind: str, count: int, scratch: Path, recording: Path, profile: Path | None = None) -> Usage:
    """``kind`` over ``count`` simulated nodes in a fresh process; its output is checked (every node
    converged and ready, nothing changed) and a failed run stops the bench, naming an unrecorded command."""
    inventory = scratch / f"nodes{count}.py"
    if not inventory.exists():
        inventory.write_text(f'"""{count} simulated nodes."""\n\nhosts = [f"sim{{i:05d}}" for i in range({count})]\n')
    profiling = ["-m", "cProfile", "-o", str(profile)] if profile else []
    command = [
        sys.executable,
        *profiling,
        __file__,
        "--child",
        "replay",
        str(recording),
        *_args(KINDS[kind], inventory),
    ]
    log = scratch / "output.log"
    with log.open("w") as output:
        started = time.monotonic()
        process = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            env={**os.environ, "PYINFRA_PROGRESS": "off"},
        )  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - started
    text = log.read_text()
    unrecorded = [line for line in text.splitlines() if line.startswith(UNRECORDED)]
    if unrecorded:
        raise SystemExit(f"{kind}, {count} nodes: {unrecorded[0]}")
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{kind}, {count} nodes: {' '.join(command)} failed:\n{text[-5000:]}")
    problem = _unexpected(kind, count, text, json.loads(recording.read_text()).get("ready", True))
    if problem:
        raise SystemExit(f"{kind}, {count} nodes: {problem}; the output's end:\n{text[-3000:]}")
    return Usage(usage.ru_utime + usage.ru_stime, usage.ru_maxrss, wall)


def _unexpected(kind: str, count: int, output: str, ready: bool = True) -> str | None:
    """What is wrong with a run's output: a node not ready (``ready``: the recorded node was; a planted GPU
    node without a device NVML can open is not), a change or an error where none belongs."""
    expected = f"{count if ready else 0} of {count} nodes ready"
    if kind not in FLOORS and expected not in output:
        return f"not '{expected}'"
    totals = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    if kind == "dry run":
        plan = re.search(r"--> Detected changes:\n.*?\n(.*?)\n\n", output, re.DOTALL)
        if not plan or totals:
            return "no plan"
        changing = [" ".join(row.split()[:-2]) for row in plan.group(1).splitlines() if row.split()[-2:] != ["-", "-"]]
        return f"the plan changes something: {changing}" if changing else None
    if not totals:
        return "no results"
    _, success, error, _ = totals.groups()
    expected = str(count) if kind in FLOORS else "-"  # a floor's one command per node; a no-op changes nothing
    if (success, error) != (expected, "-"):
        return f"results: {success} succeeded, {error} failed (expected {expected}, -)"
    return None


def _print(medians: dict[tuple[str, int], Usage], counts: list[int]) -> set[str]:
    """The figures and their targets; returns the kinds that missed a target."""
    missed: set[str] = set()

    def verdict(ratio: float, target: float, kind: str) -> str:
        if ratio > target:
            missed.add(kind)
        return f"x{ratio:5.2f}  target <= {target:g}x  {'PASS' if ratio <= target else 'MISS'}"

    print(f"\n{'':<10}{'nodes':>6}{'CPU s':>9}{'ms/node':>9}{'RSS MiB':>9}{'KiB/node':>10}")
    for count in counts:
        for kind in KINDS:
            usage = medians[kind, count]
            print(f"{kind:<10}{count:>6}{usage.cpu:9.1f}{usage.cpu / count * 1000:9.2f}{usage.rss_mib:9.1f}"
                  f"{usage.rss_kib / count:10.1f}")  # fmt: skip
    print("\nper node against pyinfra's floor (one trivial operation from a deploy file, same connector):")
    for count in counts:
        floor = medians["floor", count]
        for kind in ("no-op", "dry run"):
            usage = medians[kind, count]
            print(f"  {kind:<8}{count:>6} nodes  CPU    {verdict(usage.cpu / floor.cpu, 2, kind)}")
            print(f"  {kind:<8}{count:>6} nodes  memory {verdict(usage.rss_kib / floor.rss_kib, 2, kind)}")
    if len(counts) > 1:
        small, big = counts[0], counts[-1]
        linear = big / small
        print(f"\n{big} nodes against {small} (linear: x{linear:g}, target <= x{linear * 1.1:g}):")
        for kind in KINDS:
            for label, attribute in (("CPU   ", "cpu"), ("memory", "rss_kib")):
                ratio = getattr(medians[kind, big], attribute) / getattr(medians[kind, small], attribute)
                print(f"  {kind:<8}{label} {verdict(ratio, linear * 1.1, kind)}")
        print(f"\nmarginal cost of a node ({small} to {big} nodes):")
        for kind in KINDS:
            cpu = (medians[kind, big].cpu - medians[kind, small].cpu) / (big - small) * 1000
            rss = (medians[kind, big].rss_kib - medians[kind, small].rss_kib) / (big - small)
            print(f"  {kind:<8}{cpu:8.2f} ms CPU {rss:8.1f} KiB")
    return missed - set(FLOORS)


def _profile(kind: str, count: int, scratch: Path, recording: Path) -> None:
    """cProfile of ``kind`` over ``count`` nodes: the top entries by cumulative time among this project's
    own functions, then every library's share of the time spent in its own code (a built-in function's
    time counted for the library that called it)."""
    out = scratch / f"{kind.replace(' ', '-')}-{count}.prof"
    measure(kind, count, scratch, recording, profile=out)
    entries = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    total = sum(own for _, _, own, _, _ in entries.values())
    print(
        f"\nprofile: {kind}, {count} nodes, {total:.1f} s under cProfile; this project's functions by cumulative time:"
    )
    print(f"{'cumulative':>11}{'share':>7}{'calls':>9}  function")
    ours = sorted(((key, value) for key, value in entries.items() if _group(key[0]) == OWN), key=lambda e: -e[1][3])
    for (filename, line, function), (_, calls, _, cumulative, _) in ours[:25]:
        print(f"{cumulative:10.2f}s{cumulative / total:7.1%}{calls:9d}  {_relative(filename)}:{line}({function})")
    shares: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, callers) in entries.items():
        group = _group(filename)
        if group is not None:
            shares[group] = shares.get(group, 0.0) + own
            continue
        for (caller, _, _), (_, _, from_caller, _) in callers.items():  # a built-in: its callers' time
            group = _group(caller) or "built-in functions"
            shares[group] = shares.get(group, 0.0) + from_caller
    print("time in each library's own code:")
    for group, seconds in sorted(shares.items(), key=lambda item: -item[1])[:12]:
        print(f"{seconds:10.2f}s{seconds / total:7.1%}  {group}")


def _group(filename: str) -> str | None:
    """Which library a profiled function belongs to: this project (``OWN``), a package, a standard
    library module, or ``None`` for a built-in."""
    if filename.startswith("~"):
        return None
    path = Path(filename) if Path(filename).is_absolute() else REPO / filename
    if REPO in path.parents and not path.is_relative_to(REPO / ".venv"):
        top = path.relative_to(REPO).parts[0]
        return OWN if top in OWN_DIRECTORIES else top
    parts = path.parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    library = next((i for i, part in enumerate(parts) if part.startswith("python3")), None)
    return f"{parts[library + 1].removesuffix('.py')} (standard library)" if library is not None else filename


def _relative(filename: str) -> str:
    path = Path(filename) if Path(filename).is_absolute() else REPO / filename
    return str(path.relative_to(REPO)) if REPO in path.parents else filename


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _child(argv: list[str]) -> None:
    """``--child record|replay RECORDING PYINFRA-ARGS...``: the ``pyinfra`` command, in this process, with the
    recording or the replaying connector in the SSH connector's place."""
    mode, recording, *arguments = argv
    if mode == "replay":
        ReplayConnector.answers = load(Path(recording))
        use_connector(ReplayConnector)
    else:
        use_connector(RecordingConnector)
        _save_on_exit(Path(recording))
    from pyinfra_cli.main import main as pyinfra_main

    sys.argv = ["pyinfra", *arguments]
    pyinfra_main()


def _save_on_exit(path: Path) -> None:
    import atexit

    def write() -> None:
        found = {key: asdict(answer) for key, answer in RecordingConnector.recorded.items()}
        path.write_text(json.dumps({"answers": found, "differing": RecordingConnector.differing}))

    atexit.register(write)


def record(node: str) -> None:
    from tests.fleet.fleet import Fleet, HostSpec
    from tests.integration.gpu_state import UNPLANT, plant_preinstalled_driver

    def on(command: str, data: bytes | None) -> None:
        done = subprocess.run(["ssh", "-F", str(fleet.ssh_config_path), RECORD_HOST, command], input=data,
                              capture_output=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"planting the GPU node: {command[:80]}: {done.stderr.decode()[-2000:]}")

    recording = RECORDINGS[node]
    fleet = Fleet([HostSpec(RECORD_HOST, "trixie")], name=RECORD_FLEET)
    fleet.down()
    fleet.up()
    try:
        if node == "gpu":
            plant_preinstalled_driver(on)
        _pyinfra_checked([str(Path(sys.executable).with_name("pyinfra")), *_args(KINDS["no-op"], fleet.inventory_path)])
        answers: dict[str, dict[str, Any]] = {}
        differing: list[str] = []
        ready = True
        with tempfile.TemporaryDirectory() as scratch:
            for kind, args in KINDS.items():
                part = Path(scratch) / "part.json"
                output = _pyinfra_checked(
                    [sys.executable, __file__, "--child", "record", str(part), *_args(args, fleet.inventory_path)]
                )
                if kind == "no-op":
                    ready = "1 of 1 nodes ready" in output
                problem = _unexpected(kind, 1, output, ready)  # the host is converged: nothing changes or is planned
                if problem:
                    raise SystemExit(f"recording {kind}: {problem}; the output's end:\n{output[-3000:]}")
                found = json.loads(part.read_text())
                print(f"{kind}: {len(found['answers'])} commands recorded")
                for key, answer in found["answers"].items():
                    answers.setdefault(key, answer)
                differing += found["differing"]
    finally:
        if node == "gpu":
            fleet.run(RECORD_HOST, UNPLANT)
        fleet.down()
    recording.parent.mkdir(exist_ok=True)
    save(recording, {**_header(node), "ready": ready}, {key: Answer(**answer) for key, answer in answers.items()})
    state = "ready" if ready else "not ready"
    print(f"{len(answers)} commands written to {recording.relative_to(REPO)} (the node {state})")
    for key in differing:  # volatile output (a timestamp, a PID) read twice: the first answer is kept
        print(f"answered differently in two runs, first answer kept: {key[:100]}")


def _header(node: str) -> dict[str, object]:
    from importlib.metadata import version

    return {
        "about": (
            "Answers of one real test host to every command the controller bench sends, replayed by "
            "bench/replay.py's ReplayConnector. Recorded by `bench/controller.py --record`: a trixie "
            f"systemd-nspawn test host (tests/fleet, {GPU_NODES[node]}) converged with `pyinfra -y INVENTORY "
            "deploys/gpu_node.py`, then each configuration below run against it over SSH through "
            "RecordingConnector. Keys: the command line as pyinfra's SSH connector sends it, the host's "
            "name as {node}, pyinfra temp paths as /tmp/pyinfra-{temp}, timestamps as {timestamp}."
        ),
        "pyinfra": version("pyinfra"),
        "recorded": time.strftime("%Y-%m-%d"),
        "runs": [" ".join(("pyinfra", *args)) for args in KINDS.values()],
    }


def _args(args: tuple[str, ...], inventory: Path) -> list[str]:
    return [str(inventory) if arg == "INVENTORY" else arg for arg in args]


def _pyinfra_checked(command: list[str]) -> str:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{(result.stdout + result.stderr)[-5000:]}")
    return result.stdout + result.stderr


if __name__ == "__main__":
    main()
