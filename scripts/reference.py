"""Write docs/reference.md, the reference generated from the code: every operation and fact with its
signature and docstring, and the host-data keys.

Usage: .venv/bin/python scripts/reference.py [--check]
  --check   write nothing; exit 1 when docs/reference.md differs from what the code gives
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pyinfra.api import FactBase

from pyinfra_gpunode import hostdata

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
ROOT = REFERENCE.parents[1]
# The order subjects appear in, for operations and facts alike (the order a deploy meets them).
SUBJECTS = (
    "node",
    "distribution",
    "hostdata",
    "kernel",
    "unattended_upgrades",
    "gpus",
    "driver",
    "nvml",
    "fabric_manager",
    "persistence",
    "toolkit",
    "package_index",
    "cdi",
    "containerd",
    "platform",
    "k0s",
    "rancher",
    "operator",
    "identity",
    "rollout",
    "readiness",
    "converged",
)


def modules(folder: str) -> list[str]:
    """The public modules of ``folder`` (``operations`` or ``facts``) in ``SUBJECTS`` order; one that
    ``SUBJECTS`` does not name stops the render, so the reference never leaves a module out."""
    found = {path.stem for path in (ROOT / folder).glob("*.py") if not path.stem.startswith("_")}
    unlisted = found.difference(SUBJECTS)
    if unlisted:
        raise SystemExit(f"scripts/reference.py: add {sorted(unlisted)} ({folder}/) to SUBJECTS")
    return [name for name in SUBJECTS if name in found]


def render() -> str:
    parts = [
        "# Reference",
        "",
        "Generated from the code by `scripts/reference.py`; a test keeps it equal. The guide is"
        " [README.md](../README.md).",
        "",
        "## Operations",
        "",
    ]
    for name in modules("operations"):
        module = importlib.import_module(f"pyinfra_gpunode.operations.{name}")
        entries = [(attr, value) for attr, value in _own(module) if hasattr(value, "_inner")]
        parts += _section(f"pyinfra_gpunode.operations.{name}", entries, lambda op: op._inner)
    parts += ["## Facts", ""]
    for name in modules("facts"):
        module = importlib.import_module(f"pyinfra_gpunode.facts.{name}")
        entries = [
            (attr, value)
            for attr, value in _own(module)
            if inspect.isclass(value) and issubclass(value, FactBase) and value is not FactBase
        ]
        parts += _section(f"pyinfra_gpunode.facts.{name}", entries, lambda fact: fact.command)
    parts += ["## Host data", "", hostdata.markdown_table(), ""]
    return "\n".join(parts)


def _own(module: ModuleType) -> list[tuple[str, Any]]:
    """Public names defined in ``module`` itself, in source order."""
    found = [
        (attr, value)
        for attr, value in vars(module).items()
        if not attr.startswith("_") and getattr(value, "__module__", None) == module.__name__
    ]
    return sorted(found, key=lambda item: _line(item[1]))


def _line(value: Any) -> int:
    try:
        return inspect.getsourcelines(getattr(value, "_inner", value))[1]
    except (OSError, TypeError):
        return 0


def _section(title: str, entries: list[tuple[str, Any]], signed: Any) -> list[str]:
    if not entries:
        return []
    lines = [f"### `{title}`", ""]
    for attr, value in entries:
        signature = inspect.signature(signed(value))
        arguments = ", ".join(str(p) for p in signature.parameters.values() if p.name not in ("self", "host"))
        lines += [f"#### `{attr}({arguments})`", "", inspect.cleandoc(value.__doc__ or "(no docstring)"), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = REFERENCE.read_text() if REFERENCE.exists() else ""
        if current != text:
            print(f"{REFERENCE.name} is out of date: run scripts/reference.py", file=sys.stderr)
            return 1
        return 0
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
