"""One sick node never stops the fleet: a poisoned node's data fails that node alone.

Four Debian trixie roots (containerd 1.7.24) through the real CLI: a healthy one, one whose config.toml
is a 1 KB file nested 600 levels deep (tomllib, and every recursive walk after it, raise ``RecursionError``
on it), and one whose drop-in nests dotted tables 300 levels deep (parsed, but no deep copy survives it).
A fourth has a CDI spec with a Latin-1 byte. A fifth imports a named pipe (as a file on a hung mount
would, it keeps the real ``containerd config dump`` waiting forever). The readiness report and the
deploy's dry run both finish for every node; the healthy node gets its report and its plan as it would
alone, the poisoned ones name their file or the read that did not answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cli
from tests.fleet.roots import planted_copies
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS

pytestmark = pytest.mark.containerd
ARRAYS = "version = 2\n" + IMPORTS + "x = " + "[" * 600 + "]" * 600 + "\n"
DOTTED = "version = 2\n[" + ".".join(["k"] * 300) + "]\nx = 1\n"
ODD_CONTAINERD = (
    '#!/bin/sh\nif [ "$1" = --version ]; then echo "containerd vendor build 7"; exit 0; fi\n'
    'exec /usr/bin/containerd "$@"\n'
)
FIFO = object()  # a named pipe nothing ever writes to
DUMP_SECONDS = "3"  # GPUNODE_DUMP_SECONDS: how long the runs wait for a dump
LATIN1 = b"cdiVersion: 0.5.0\nkind: example.com/x\n# caf\xe9\ndevices:\n- name: a\n  containerEdits: {}\n"


def plant(files: dict[str, str | bytes | object]):
    def planted(root: Path) -> None:
        for path, text in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if text is FIFO:
                os.mkfifo(target)
            else:
                target.write_bytes(text if isinstance(text, bytes) else str(text).encode())
                if "/bin/" in path:
                    target.chmod(0o755)
        (root / "usr/bin/ctr").unlink()  # no daemon runs in a root: ctr would wait for its socket

    return planted


NODES = {
    "healthy": plant({CONFIG: "version = 2\n" + IMPORTS}),
    "deep_config": plant({CONFIG: ARRAYS}),
    "deep_dropin": plant({CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/10-deep.toml": DOTTED}),
    # One Latin-1 byte: the controller reads a node's output as UTF-8, and a byte it cannot decode ended the
    # read there (everything after the CDI specs, containerd among it, then looked absent).
    "latin1_spec": plant({CONFIG: "version = 2\n" + IMPORTS, "/etc/cdi/vendor.yaml": LATIN1}),
    "hung_import": plant({CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/20-hung.toml": FIFO}),
    # A vendor build whose --version is in no form the controller knows: its read fails (pyinfra's own
    # handling), and what the deploy does next with no value must fail this node alone.
    "odd_version": plant({CONFIG: "version = 2\n" + IMPORTS, "/usr/local/bin/containerd": ODD_CONTAINERD}),
}
HUNG = f"containerd config dump did not answer within {DUMP_SECONDS} s"


@pytest.fixture
def roots(trixie_root: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    with planted_copies(trixie_root, tmp_path, NODES) as copies:
        yield copies


def going_on(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``pyinfra ARGS``, answering each "One of more hosts failed, continue?" with Enter (``-y`` would skip
    the change detection that prints the plans)."""
    return subprocess.run(
        [str(cli.PYINFRA), *args], cwd=cli.REPO, input="\n" * 20, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip


def lines_of(output: str, root: Path) -> list[str]:
    return [line for line in output.splitlines() if f"[@chroot/{root}]" in line]


def test_a_deeply_nested_file_fails_its_node_alone(roots: dict[str, Path], tmp_path: Path) -> None:
    inventory = ",".join(f"@chroot/{root}" for root in roots.values())
    report = tmp_path / "report.json"
    limit = {"GPUNODE_DUMP_SECONDS": DUMP_SECONDS}
    readiness = cli.pyinfra(
        "-y", "--data", f"gpunode_readiness_json={report}", inventory, "deploys/readiness.py", env=limit, timeout=300
    )
    assert "Traceback" not in readiness.stdout and "RecursionError" not in readiness.stdout, readiness.stdout
    document = json.loads(report.read_text())
    assert document["run"]["complete"] is True
    nodes = {node["node"]: node for node in document["nodes"]}
    assert set(nodes) == {f"@chroot/{root}" for root in roots.values()}
    # Every node reported, each by its own files (none defines the nvidia runtime yet); the deep config.toml
    # is one containerd itself reads.
    hung = nodes.pop(f"@chroot/{roots['hung_import']}")
    odd = nodes.pop(f"@chroot/{roots['odd_version']}")
    assert (odd["state"], odd["first_broken"]) == ("not_ready", "read"), odd
    assert odd["cause"].endswith("a read of this node failed (pyinfra printed its error above)"), odd
    assert "containerd --version printed an unknown form: ['containerd vendor build 7']" in readiness.stdout
    for node in nodes.values():
        assert (node["state"], node["first_broken"]) == ("not_ready", "containerd_config"), node
        assert node["cause"] == f"no config file loaded from {CONFIG} defines the nvidia runtime", node
    assert hung["state"] != "ready" and HUNG in json.dumps(hung), hung

    dry = going_on(
        "--dry", "--data", "gpunode_containerd_restart=none", inventory, "deploys/containerd_runtime.py", env=limit
    )
    assert "Traceback" not in dry.stdout and "RecursionError" not in dry.stdout, dry.stdout
    healthy_lines = "\n".join(lines_of(dry.stdout, roots["healthy"]))
    assert "nvidia-runtime.toml" in healthy_lines, dry.stdout
    config_lines = "\n".join(lines_of(dry.stdout, roots["deep_config"]))
    assert f"{CONFIG}: invalid TOML: nested too deeply to read (at most 64 levels are)" in config_lines, dry.stdout
    dropin_lines = "\n".join(lines_of(dry.stdout, roots["deep_dropin"]))
    assert f"{CONFD}/10-deep.toml: invalid TOML: nested 301 levels deep: at most 64 are read" in dropin_lines, (
        dry.stdout
    )
    hung_lines = "\n".join(lines_of(dry.stdout, roots["hung_import"]))
    assert HUNG in hung_lines, dry.stdout
    odd_lines = "\n".join(lines_of(dry.stdout, roots["odd_version"]))
    assert "the containerd runtime not planned: a read of this node failed" in odd_lines, dry.stdout

    # The whole deploy: the node fails alone there too, and every other node is planned.
    whole = going_on("--dry", inventory, "deploys/gpu_node.py", env=limit)
    assert "Traceback" not in whole.stdout and "internal exception" not in whole.stdout, whole.stdout
    assert "the GPU node not planned: a read of this node failed" in "\n".join(
        lines_of(whole.stdout, roots["odd_version"])
    ), whole.stdout
    assert "Ready: deploys/gpu_node.py" in "\n".join(lines_of(whole.stdout, roots["healthy"])), whole.stdout
