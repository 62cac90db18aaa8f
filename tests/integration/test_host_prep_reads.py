"""The host-preparation steps share one read per node (the node snapshot), on a Debian trixie root through
pyinfra's ``@chroot``: a converged node is read once for all three steps, and a step reads again after anything
ran on the node."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.operations import server

from pyinfra_gpunode.facts.kernel import initramfs_stamp
from pyinfra_gpunode.operations import kernel, unattended_upgrades
from tests.integration import test_host_prep as prep

pytestmark = [
    pytest.mark.chroot,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, overlay mounts)"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="needs debootstrap"),
]

Op = tuple[Callable[..., Any], dict[str, Any]]
base_root, node = prep.base_root, prep.node  # the cached trixie root and an overlay copy per test
# The snapshot and the single facts read in its place once it is outdated.
READS = ("NodeSnapshot", "KernelState", "UnattendedUpgradesState", "NouveauBlacklist")


def run(root: Path, caplog: pytest.LogCaptureFixture, *ops: Op) -> tuple[int, int]:
    """Run ``ops`` as ``pyinfra -y`` does (no prepare pass); return (node reads, operations that changed)."""
    inventory = Inventory(([f"@chroot/{root}"], {}))
    state = State(inventory=inventory, config=Config(FAIL_PERCENT=0), check_for_changes=False)
    connect_all(state)
    caplog.clear()
    try:
        (host,) = inventory
        for op, kwargs in ops:
            add_op(state, op, **kwargs)
        run_ops(state)
        assert not state.failed_hosts, "an operation failed"
        metas = state.ops[host].values()
        changed = sum(1 for data in metas if data.operation_meta.did_change())
    finally:
        disconnect_all(state)
    reads = sum(1 for record in caplog.records if "Loaded fact" in record.getMessage() and any(
                name in record.getMessage() for name in READS))  # fmt: skip
    return reads, changed


def steps(root: Path) -> list[Op]:
    return [
        (kernel.held, {"name": "kernel held", "release": prep.installed_kernel(root)}),
        (unattended_upgrades.configured, {"name": "unattended off"}),
        (kernel.nouveau_blacklisted, {"name": "nouveau blacklisted"}),
    ]


def test_converged_node_read_once_changed_node_read_again(node: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="pyinfra")
    assert run(node, caplog, *steps(node)) == (3, 3)  # each step changed the node: the next one read it again
    assert "linux-image-cloud-amd64" in (node / "var/lib/dpkg/status").read_text()
    assert run(node, caplog, *steps(node)) == (1, 0)


def test_a_step_after_another_operation_reads_the_node_again(node: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="pyinfra")
    run(node, caplog, *steps(node))
    conf = node / kernel.NOUVEAU_CONF.lstrip("/")
    stamp = node / initramfs_stamp(kernel.NOUVEAU_CONF).lstrip("/")
    conf.unlink()
    stamp.unlink()
    # Between the kernel step and the nouveau step another operation restores both files: the
    # nouveau step must see them (no change), not the read taken before that operation ran.
    text, path = shlex.quote(kernel.NOUVEAU_TEXT), kernel.NOUVEAU_CONF
    restore = f"printf %s {text} | tee {path} > {initramfs_stamp(path)}"
    first, _, last = steps(node)
    reads, changed = run(node, caplog, first, (server.shell, {"name": "restore", "commands": [restore]}), last)
    assert (reads, changed) == (2, 1)  # only the shell operation changed the node
    assert conf.read_text() == kernel.NOUVEAU_TEXT
