"""Verification of ready GPU nodes, run against a pyinfra inventory:

    pytest tests/verify --inventory inventories/production.py [--gpunode-checks=containerd,host,gpu]

Without ``--inventory`` these tests are deselected (they describe the user's nodes, not this
repository's code).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from .inventory import Node, load_nodes

CHECKS = ("containerd", "gpu", "host")
VERIFY_DIR = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpunode", "verification of GPU nodes")
    group.addoption("--inventory", help="pyinfra inventory (.py) of the nodes to verify")
    group.addoption(
        "--gpunode-checks", default=",".join(CHECKS),
        help=f"comma-separated check groups to run, of {', '.join(CHECKS)} (default: all)",
    )


def _inventory(config: pytest.Config) -> str | None:
    try:
        return config.getoption("inventory")
    except ValueError:  # options of a conftest found only while collecting are not parsed
        return None


def _selected_checks(config: pytest.Config) -> set[str]:
    selected = {c.strip() for c in config.getoption("gpunode_checks", ",".join(CHECKS)).split(",") if c.strip()}
    unknown = selected - set(CHECKS)
    if unknown:
        raise pytest.UsageError(f"--gpunode-checks: unknown {', '.join(sorted(unknown))} (known: {', '.join(CHECKS)})")
    return selected


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    inventory = _inventory(config)
    selected = _selected_checks(config) if inventory else set()
    keep, drop = [], []
    for item in items:
        if VERIFY_DIR not in item.path.parents:
            keep.append(item)
        elif item.path.stem.removeprefix("test_") in selected:
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    inventory = _inventory(config)
    if inventory is None:
        return "gpunode verification: deselected (no --inventory)"
    return f"gpunode verification: {inventory}, checks {','.join(sorted(_selected_checks(config)))}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node" not in metafunc.fixturenames:
        return
    inventory = _inventory(metafunc.config)
    nodes = _nodes(metafunc.config, Path(inventory)) if inventory else []
    metafunc.parametrize("node", nodes, ids=[node.name for node in nodes], scope="session")


def _nodes(config: pytest.Config, inventory: Path) -> list[Node]:
    cached: list[Node] | None = getattr(config, "_gpunode_nodes", None)
    if cached is None:
        directory = tempfile.mkdtemp(prefix="gpunode-verify-")
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        cached = load_nodes(inventory, Path(directory) / "ssh_config")
        config._gpunode_nodes = cached  # type: ignore[attr-defined]
    return cached
