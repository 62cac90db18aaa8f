"""pytest plugin of the verification suite (registered through the ``pytest11`` entry point).

    pytest --pyargs pyinfra_gpunode.verify --inventory inventories/production.py [--gpunode-checks=containerd,gpu,host]

Its hooks act only on the suite's own tests; without ``--inventory`` those are deselected (they
describe the user's nodes, not this package's code).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .inventory import Node

CHECKS = ("containerd", "gpu", "host")
VERIFY_DIR = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpunode", "verification of GPU nodes (pyinfra_gpunode.verify)")
    group.addoption("--inventory", help="pyinfra inventory (.py) of the nodes to verify")
    group.addoption(
        "--gpunode-checks",
        default=",".join(CHECKS),
        help=f"comma-separated check groups to run, of {', '.join(CHECKS)} (default: all)",
    )


def _in_suite(path: Path) -> bool:
    return VERIFY_DIR in Path(path).resolve().parents


def _selected_checks(config: pytest.Config) -> set[str]:
    selected = {c.strip() for c in config.getoption("gpunode_checks").split(",") if c.strip()}
    unknown = selected - set(CHECKS)
    if unknown:
        raise pytest.UsageError(f"--gpunode-checks: unknown {', '.join(sorted(unknown))} (known: {', '.join(CHECKS)})")
    return selected


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    inventory = config.getoption("inventory")
    selected = _selected_checks(config) if inventory else set()
    keep, drop = [], []
    for item in items:
        if not _in_suite(item.path) or item.path.stem.removeprefix("test_") in selected:
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    inventory = config.getoption("inventory")
    if inventory is None:
        return None
    return f"gpunode verification: {inventory}, checks {','.join(sorted(_selected_checks(config)))}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node" not in metafunc.fixturenames or not _in_suite(metafunc.definition.path):
        return
    inventory = metafunc.config.getoption("inventory")
    nodes = _nodes(metafunc.config, Path(inventory)) if inventory else []
    metafunc.parametrize("node", nodes, ids=[node.name for node in nodes], scope="session")


def _nodes(config: pytest.Config, inventory: Path) -> list[Node]:
    cached: list[Node] | None = getattr(config, "_gpunode_nodes", None)
    if cached is None:
        from .inventory import load_nodes  # testinfra and pyinfra's CLI only when nodes are verified

        directory = tempfile.mkdtemp(prefix="gpunode-verify-")
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        cached = load_nodes(inventory, Path(directory) / "ssh_config")
        config._gpunode_nodes = cached  # type: ignore[attr-defined]
    return cached
