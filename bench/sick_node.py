"""One sick node among healthy ones: the readiness report's time for the healthy nodes, with and without it.

    .venv/bin/python bench/sick_node.py [--nodes 4] [--runs 3]     # as root: Debian trixie roots (@chroot)

Each configuration runs ``pyinfra -y deploys/readiness.py`` over ``--nodes`` healthy copies of the cached
trixie root (containerd 1.7.24), alone and then beside one poisoned copy:

- ``hung dump``: an import that is a named pipe (``containerd config dump`` never answers; left behind after
  ``GPUNODE_DUMP_SECONDS``, 3 s here);
- ``deep toml``: a config.toml nested 600 levels deep;
- ``many specs``: 64 CDI specs of 240 KB each (the per-node budget: 64 specs, 16 MiB, 10 s).

Printed per configuration: the run's wall time, the latest ``read_at`` of a healthy node after the run's
start (when the last healthy node had its report), and the ratios to the healthy-only run. Target: a poison
adds at most its own limit (the dump's 3 s, the CDI budget's 10 s) to the run, and nothing to when the
healthy nodes are read (ratio <= 1.5, for the noise of a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fleet.roots import RootRecipe, ensure_root, planted_copies  # noqa: E402
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
DUMP_SECONDS = "3"
SPEC_BYTES = 240_000


def healthy(root: Path) -> None:
    (root / CONFIG.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / CONFIG.lstrip("/")).write_text("version = 2\n" + IMPORTS)


def hung_dump(root: Path) -> None:
    healthy(root)
    confd = root / CONFD.lstrip("/")
    confd.mkdir(parents=True, exist_ok=True)
    os.mkfifo(confd / "20-hung.toml")


def deep_toml(root: Path) -> None:
    (root / CONFIG.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / CONFIG.lstrip("/")).write_text("version = 2\n" + IMPORTS + "x = " + "[" * 600 + "]" * 600 + "\n")


def many_specs(root: Path) -> None:
    healthy(root)
    cdi = root / "etc/cdi"
    cdi.mkdir(parents=True, exist_ok=True)
    padding = "# " + "x" * 78 + "\n"
    for index in range(64):
        body = f"cdiVersion: 0.5.0\nkind: example.com/dev{index}\ndevices:\n- name: a\n  containerEdits: {{}}\n"
        (cdi / f"vendor-{index}.yaml").write_text(body + padding * (SPEC_BYTES // len(padding)))


POISONS: dict[str, Callable[[Path], None]] = {"hung dump": hung_dump, "deep toml": deep_toml, "many specs": many_specs}


def run(roots: dict[str, Path], report: Path) -> tuple[float, float]:
    """``(wall seconds, seconds from the run's start until its last healthy node was read)``."""
    inventory = ",".join(f"@chroot/{root}" for root in roots.values())
    started = time.monotonic()
    subprocess.run(
        [PYINFRA, "-y", "--data", f"gpunode_readiness_json={report}", inventory, "deploys/readiness.py"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "GPUNODE_DUMP_SECONDS": DUMP_SECONDS},
    )  # fmt: skip
    wall = time.monotonic() - started
    document = json.loads(report.read_text())
    start = datetime.fromisoformat(document["run"]["started"])
    healthy_nodes = {f"@chroot/{root}" for name, root in roots.items() if name.startswith("healthy")}
    read = [
        (datetime.fromisoformat(node["read_at"]) - start).total_seconds()
        for node in document["nodes"]
        if node["node"] in healthy_nodes
    ]
    return wall, max(read)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="healthy nodes in every configuration")
    parser.add_argument("--runs", type=int, default=3, help="repetitions per configuration (median reported)")
    args = parser.parse_args()
    lower = ensure_root(RootRecipe("trixie"))
    plants = {f"healthy{index}": healthy for index in range(args.nodes)} | {
        f"poison {name}": plant for name, plant in POISONS.items()
    }
    with (
        tempfile.TemporaryDirectory(prefix="gpunode-sick-bench.") as scratch,
        planted_copies(lower, Path(scratch), plants) as roots,
    ):
        report = Path(scratch) / "report.json"
        base = {name: root for name, root in roots.items() if name.startswith("healthy")}
        configurations = {"healthy only": base} | {
            name: base | {f"poison {name}": roots[f"poison {name}"]} for name in POISONS
        }
        figures: dict[str, tuple[float, float]] = {}
        for name, chosen in configurations.items():
            measured = [run(chosen, report) for _ in range(args.runs)]
            figures[name] = (
                statistics.median(wall for wall, _ in measured),
                statistics.median(read for _, read in measured),
            )
    wall0, read0 = figures["healthy only"]
    print(f"{args.nodes} healthy trixie roots, {args.runs} run(s) each, medians; GPUNODE_DUMP_SECONDS={DUMP_SECONDS}")
    print(f"{'configuration':<14} {'wall s':>7} {'x':>6} {'healthy read by s':>18} {'x':>6}")
    for name, (wall, read) in figures.items():
        verdict = "" if name == "healthy only" else ("  PASS" if read <= 1.5 * max(read0, 0.5) else "  MISS")
        print(f"{name:<14} {wall:7.1f} {wall / wall0:6.2f} {read:18.1f} {read / max(read0, 0.01):6.2f}{verdict}")


if __name__ == "__main__":
    main()
