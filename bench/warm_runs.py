"""Test runs: a pyinfra run as the tests start it (forked from the warm server, ``tests/cli_server.py``)
against the ``pyinfra`` script started afresh, each figure with its warm/script ratio.

    .venv/bin/python bench/warm_runs.py [--runs 20]      # seconds; touches no host

Each run loads an inventory file naming no host (so it connects nowhere and changes nothing) and exits:
what is measured is the start, the imports and the CLI's own setup that every test's run pays. Wall time
per run, median of ``--runs``, taken alternately; the server's own start is measured once and shown apart.
Target: a warm run <= 0.3x of a script run. The machine's load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import cli  # noqa: E402


def timed(directory: Path) -> float:
    began = time.monotonic()
    done = cli.pyinfra("inventory.py", "exec", "--", "true", cwd=directory)
    assert done.returncode == 0, done.stdout
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-runs.") as scratch:
        directory = Path(scratch)
        (directory / "inventory.py").write_text("hosts = []\n")
        os.environ.pop("GPUNODE_TESTS_CLI", None)
        first = timed(directory)  # starts the server
        warm, script = [], []
        for _ in range(runs):
            warm.append(timed(directory))
            os.environ["GPUNODE_TESTS_CLI"] = "exec"
            script.append(timed(directory))
            del os.environ["GPUNODE_TESTS_CLI"]
    load = os.getloadavg()[0]
    warm_median, script_median = statistics.median(warm), statistics.median(script)
    ratio = warm_median / script_median
    print(f"load average {load:.2f}; {runs} runs each")
    print(f"first warm run (the server starts): {first:.2f} s")
    print(f"warm run: {warm_median:.3f} s; script run: {script_median:.3f} s")
    print(f"warm/script: {ratio:.2f}x (target <= 0.3x) {'PASS' if ratio <= 0.3 else 'MISS'}")


if __name__ == "__main__":
    main()
