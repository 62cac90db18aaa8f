"""docs/reference.md is what scripts/reference.py generates from the code, and covers every module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpunode_reference", REPO / "scripts" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_is_generated_from_the_code() -> None:
    generator = _generator()
    assert (REPO / "docs" / "reference.md").read_text() == generator.render(), (
        "docs/reference.md is out of date: run .venv/bin/python scripts/reference.py"
    )


def test_reference_lists_every_operation_and_fact_module() -> None:
    generator = _generator()
    for folder in ("operations", "facts"):
        modules = {path.stem for path in (REPO / folder).glob("*.py") if not path.stem.startswith("_")}
        listed = generator.modules(folder)
        assert modules == set(listed), f"scripts/reference.py lists {folder} modules {sorted(listed)}"


def test_a_module_the_reference_does_not_name_stops_the_render(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    monkeypatch.setattr(generator, "SUBJECTS", tuple(name for name in generator.SUBJECTS if name != "k0s"))
    with pytest.raises(SystemExit, match=r"add \['k0s'\] \(facts/\) to SUBJECTS"):
        generator.render()


def test_reference_names_each_operations_arguments() -> None:
    text = (REPO / "docs" / "reference.md").read_text()
    assert "#### `nvidia_runtime(binary: 'str' = '/usr/bin/nvidia-container-runtime'" in text
    assert "+ binary:" in text and "#### `ContainerdNodeState(binary: 'str')`" in text
