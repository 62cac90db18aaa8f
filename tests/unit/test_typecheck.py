"""The type check (scripts/typecheck.sh, run by scripts/lint.sh) sees the package's own calls."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_wrong_call_between_the_packages_modules_fails_the_type_check(tmp_path: Path) -> None:
    # A copy of the sources with one mistyped call from pyinfra_gpunode.operations into pyinfra_gpunode:
    # checked the way users import them, it must fail naming the call (checked as Any, it would pass).
    for name in ("gpunode", "facts", "operations", "verify", "templates"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    module = tmp_path / "operations" / "driver.py"
    text = module.read_text()
    assert "\nfrom pyinfra_gpunode.driver_versions import same_driver" in text
    module.write_text(text + "\n\ndef _mistyped() -> bool:\n    return same_driver(1, 2, 3)\n")
    line = len(module.read_text().splitlines())

    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "typecheck.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode != 0, result.stdout + result.stderr
    assert f'operations/driver.py:{line}: error: Too many arguments for "same_driver"' in result.stdout, result.stdout
