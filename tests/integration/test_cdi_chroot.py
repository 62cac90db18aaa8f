"""cdi.spec through pyinfra on a Debian root (``@chroot``) with two planted GPUs and a loaded driver.

A spec that lists too few GPUs is regenerated, and the next run finds it current; a spec that does
not parse fails the node naming the file, in the plan of a dry run too, and nothing is written.
``nvidia-ctk`` (in no Debian archive) is a stand-in that writes a spec in nvidia-ctk's layout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.operations import cdi
from tests.fleet.plugin import require_fleet
from tests.fleet.roots import RootRecipe, ensure_root, writable_copy
from tests.integration.gpu_state import DRIVER, cdi_spec, plant_gpu, plant_library, plant_module, write

SPEC = "etc/cdi/nvidia.yaml"
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
pytestmark = pytest.mark.chroot


def two_gpu_spec() -> str:
    """What nvidia-ctk writes for two GPUs: devices 0, 1 and all (keys sorted)."""
    second = "- containerEdits:\n    deviceNodes:\n    - hostPath: /dev/nvidia1\n      path: /dev/nvidia1\n"
    second += '  name: "1"\n'
    return cdi_spec().replace('  name: "0"\n', '  name: "0"\n' + second, 1)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    require_fleet()
    with writable_copy(ensure_root(RootRecipe("trixie")), tmp_path) as merged:
        for address in ("0000:41:00.0", "0000:42:00.0"):
            plant_gpu(merged / "sys/bus/pci/devices", address)
        plant_module(merged / "sys/module", merged / "proc/driver")
        plant_library(merged)
        generate = (
            '#!/bin/sh\nfor arg; do case "$arg" in --output=*) out=${arg#--output=};; esac; done\n'
            f"cat > \"$out\" << 'EOF'\n{two_gpu_spec()}EOF\n"
        )
        write(merged, "/usr/local/bin/nvidia-ctk", generate, 0o755)
        yield merged


def spec_op(root: Path, execute: bool, op: Any = cdi.spec, **kwargs: Any) -> State:
    """``cdi.spec`` (or ``op``) on the root: planned (``execute=False``, a dry run) or run."""
    inventory = Inventory(([f"@chroot/{root}"], {}))
    state = State(inventory=inventory, config=Config(), check_for_changes=True)
    state.print_noop_info = True
    connect_all(state)
    try:
        add_op(state, op, **kwargs)
        if execute:
            try:
                run_ops(state)
            except PyinfraError:  # "No hosts remaining!" once the only host failed
                assert state.failed_hosts
    finally:
        disconnect_all(state)
    return state


def test_spec_listing_too_few_gpus_is_regenerated_then_current(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(root, f"/{SPEC}", cdi_spec())  # devices 0 and all, for the planted driver
    caplog.set_level(logging.INFO)
    state = spec_op(root, execute=True)
    assert not state.failed_hosts
    assert (root / SPEC).read_text() == two_gpu_spec()
    assert not (root / f"{SPEC}.gpunode-tmp").exists()
    caplog.clear()
    again = spec_op(root, execute=True)
    assert not again.failed_hosts
    assert f"CDI spec /{SPEC} matches driver {DRIVER} and lists the node's 2 GPU(s) and all" in caplog.text


def test_spec_that_does_not_parse_fails_the_node_naming_it(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    broken = cdi_spec()[:120] + "  - hostPath: [unclosed\n"
    write(root, f"/{SPEC}", broken)
    caplog.set_level(logging.INFO)
    spec_op(root, execute=False)
    assert f"plan: /{SPEC} is not valid YAML or JSON: " in caplog.text
    state = spec_op(root, execute=True)
    assert state.failed_hosts
    assert f"/{SPEC} is not valid YAML or JSON" in caplog.text and "move it away or fix it" in caplog.text
    assert (root / SPEC).read_text() == broken
    assert sorted(p.name for p in (root / "etc/cdi").iterdir()) == ["nvidia.yaml"]


def plant_refresh_units(root: Path) -> None:
    """Toolkit 1.18's refresh units where its package puts them (/etc/systemd/system), as released."""
    units = (SAMPLES / "nvidia-cdi-refresh-units-1.18.txt").read_text().split("#### ")[1:]
    for unit in units:
        name, _, text = unit.partition("\n")
        write(root, f"/etc/systemd/system/{name}", text)


def test_refresh_service_gets_no_start_limit_once(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    spec_op(root, execute=True, op=cdi.refresh_start_limit)
    assert not (root / "etc/systemd/system/nvidia-cdi-refresh.service.d").exists()  # no service: left alone
    assert "nvidia-cdi-refresh.service is not installed" in caplog.text
    plant_refresh_units(root)
    state = spec_op(root, execute=True, op=cdi.refresh_start_limit)
    assert not state.failed_hosts
    dropin = root / "etc/systemd/system/nvidia-cdi-refresh.service.d/gpunode.conf"
    assert dropin.read_text().endswith("[Unit]\nStartLimitIntervalSec=0\n")
    assert oct(dropin.stat().st_mode & 0o777) == "0o644"
    caplog.clear()
    spec_op(root, execute=True, op=cdi.refresh_start_limit)
    assert "nvidia-cdi-refresh.service has no start limit" in caplog.text


@pytest.mark.parametrize("stale", [False, True], ids=["no_refresh_spec", "stale_refresh_spec"])
def test_where_the_refresh_service_owns_the_spec_the_project_writes_none(
    root: Path, caplog: pytest.LogCaptureFixture, stale: bool
) -> None:
    """``auto`` with the service installed: the project's spec is reported as a duplicate and kept, the
    service is started for its own spec (missing, or left from another driver), and a start that writes
    no spec (a chroot runs no systemd) fails the node naming the service."""
    plant_refresh_units(root)
    if stale:  # through the root's real /run: its /var/run is an absolute link
        write(root, "/run/cdi/nvidia.yaml", cdi_spec("550.144.03"))
    write(root, f"/{SPEC}", cdi_spec())  # the project's spec from before the toolkit upgrade
    caplog.set_level(logging.INFO)
    state = spec_op(root, execute=True, owner="auto")
    assert state.failed_hosts
    assert f"CDI spec /{SPEC} duplicates /var/run/cdi/nvidia.yaml, which nvidia-cdi-refresh.service owns" in (
        caplog.text
    )
    assert "nvidia-cdi-refresh.service ran but wrote no /var/run/cdi/nvidia.yaml" in caplog.text
    assert (root / SPEC).read_text() == cdi_spec()  # neither rewritten nor deleted
    if stale:
        assert (root / "run/cdi/nvidia.yaml").read_text() == cdi_spec("550.144.03")
    else:
        assert not (root / "run/cdi/nvidia.yaml").exists()
