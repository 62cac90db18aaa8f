"""Refusals that must leave the node untouched, and a failed initramfs regeneration that is retried,
run for real through pyinfra (the CLI where the input comes from the command line) against an overlay
copy of the Debian trixie root (see test_host_prep.py), reached with the ``@chroot`` connector.

"Nothing written" is checked on the overlay's upper directory: every file the run created, changed or
deleted anywhere in the root would appear there.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pyinfra_gpunode.facts.kernel import initramfs_stamp
from pyinfra_gpunode.operations import kernel
from pyinfra_gpunode.operations.kernel import NOUVEAU_CONF, NOUVEAU_TEXT
from tests import cli
from tests.integration import test_host_prep

base_root, node, pytestmark = test_host_prep.base_root, test_host_prep.node, test_host_prep.pytestmark

REPO = Path(__file__).resolve().parents[2]


def written(root: Path) -> dict[str, str]:
    """Every non-directory entry of the overlay's upper layer: what was written into the root."""
    upper = root.parent / "upper"
    entries = {}
    for path in sorted(upper.rglob("*")):
        if path.is_symlink():
            entries[str(path.relative_to(upper))] = "-> " + os.readlink(path)
        elif path.is_file():
            entries[str(path.relative_to(upper))] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif not path.is_dir():
            entries[str(path.relative_to(upper))] = "special (whiteout)"
    return entries


def pyinfra(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pyinfra @chroot/<root> deploys/gpu_node.py ARGS``; output merged.

    Run beside the root, not in the checkout: the CLI leaves ``pyinfra-debug.log`` in its directory on errors.
    """
    return cli.pyinfra(
        f"@chroot/{root}", REPO / "deploys/gpu_node.py", *args,
        cwd=root.parent, timeout=300, env={"PYINFRA_PROGRESS": "off", "COLUMNS": "400"},
    )  # fmt: skip


def rocky(root: Path) -> None:
    os_release = root / "etc/os-release"
    os_release.unlink()  # Debian's is a link to ../usr/lib/os-release
    os_release.write_text('NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n')


def test_unsupported_distribution_is_refused_before_any_change(node: Path) -> None:
    rocky(node)
    before = written(node)
    etc = subprocess.run(["sh", "-c", f"cd {node}/etc && find . -type f -exec sha256sum {{}} + | sort"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip

    dry = pyinfra(node, "--dry")
    assert "plan: distribution rocky 9.4 is not supported (supported: debian, ubuntu)" in dry.stdout, dry.stdout
    assert written(node) == before

    run = pyinfra(node, "-y")
    assert run.returncode != 0
    assert "distribution rocky 9.4 is not supported" in run.stdout, run.stdout
    assert "Traceback" not in run.stdout
    for step in ("kernel: held", "unattended-upgrades", "nouveau: blacklisted", "containerd:"):
        assert f"Starting operation: {step}" not in run.stdout, step
    assert written(node) == before
    assert subprocess.run(["sh", "-c", f"cd {node}/etc && find . -type f -exec sha256sum {{}} + | sort"],
                          capture_output=True, text=True, check=True).stdout == etc  # fmt: skip


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # a trailing newline would split the apt-get install command
        (
            "gpunode_toolkit_version=1.17.8-1\n",
            "host-data key 'gpunode_toolkit_version' must not contain newlines or control characters, "
            "got '1.17.8-1<U+000A>'",
        ),
        # a newline inside a blacklist entry would silently disable it
        (
            'gpunode_unattended_blacklist=["linux-", "nvidia-\\n"]',
            "host-data key 'gpunode_unattended_blacklist' must not contain newlines or control characters",
        ),
        ("gpunode_restart_timeout=86400", "host-data key 'gpunode_restart_timeout' must be int, 1 to 3600, got 86400"),
        # --data parses 580.10 into the float 580.1: its text is lost
        (
            "gpunode_driver_version=580.10",
            "host-data key 'gpunode_driver_version' must be str or null, got the number 580.1",
        ),
    ],
    ids=["newline-version", "newline-blacklist", "timeout-too-long", "float-version"],
)
def test_command_line_data_refused_naming_the_key_and_nothing_changes(node: Path, data: str, message: str) -> None:
    before = written(node)
    run = pyinfra(node, "-y", "--data", data)
    assert run.returncode != 0
    assert message in run.stdout, run.stdout
    assert written(node) == before


def test_command_line_branch_number_is_accepted(node: Path) -> None:
    """``--data gpunode_driver_branch=580`` arrives as the int 580; it means the branch "580"."""
    before = written(node)
    dry = pyinfra(node, "--dry", "--data", "gpunode_driver_branch=580")
    assert "gpunode_driver_branch" not in dry.stdout, dry.stdout
    assert "Traceback" not in dry.stdout
    assert "kernel: held" in dry.stdout  # the plan reached the steps
    assert written(node) == before
    quoted = pyinfra(node, "--dry", "--data", 'gpunode_driver_version="580.126.20"')
    assert "gpunode_driver_version" not in quoted.stdout, quoted.stdout


FAILS_ONCE = """#!/bin/sh
calls=$(cat /var/tmp/update-initramfs.calls 2>/dev/null || echo 0)
echo $((calls + 1)) > /var/tmp/update-initramfs.calls
echo "update-initramfs $*" >> /var/tmp/update-initramfs.log
if [ "$calls" -eq 0 ]; then echo "update-initramfs: failed to build (planted)" >&2; exit 1; fi
"""


def run_op(root: Path) -> tuple[int, bool]:
    """``kernel.nouveau_blacklisted`` on the root; (ops that would change it, whether the host failed)."""
    inventory = Inventory(([f"@chroot/{root}"], {}))
    state = State(inventory=inventory, config=Config(), check_for_changes=True)
    connect_all(state)
    try:
        (host,) = inventory
        add_op(state, kernel.nouveau_blacklisted, name="nouveau: blacklisted")
        changes = state.get_meta_for_host(host).ops_change
        try:
            run_ops(state)
        except PyinfraError:  # "No hosts remaining!": the one host failed
            pass
        return int(changes), bool(state.failed_hosts)
    finally:
        disconnect_all(state)


def test_failed_initramfs_regeneration_is_retried(node: Path) -> None:
    tool = node / "usr/sbin/update-initramfs"
    tool.write_text(FAILS_ONCE)
    tool.chmod(0o755)
    calls, stamp = node / "var/tmp/update-initramfs.calls", node / initramfs_stamp(NOUVEAU_CONF).lstrip("/")
    blacklist = node / NOUVEAU_CONF.lstrip("/")

    assert run_op(node) == (1, True)  # blacklist written, update-initramfs failed: the host fails
    assert blacklist.read_text() == NOUVEAU_TEXT
    assert calls.read_text().strip() == "1"
    assert not stamp.exists()

    assert run_op(node) == (1, False)  # the file matches, but the initramfs was not rebuilt with it
    assert calls.read_text().strip() == "2"
    assert stamp.read_text() == NOUVEAU_TEXT
    assert (node / "var/tmp/update-initramfs.log").read_text().splitlines() == ["update-initramfs -u -k all"] * 2

    assert run_op(node) == (0, False)
    assert calls.read_text().strip() == "2"


def test_a_kernel_that_ships_nova_core_gets_it_blacklisted_too(node: Path) -> None:
    tool = node / "usr/sbin/update-initramfs"
    tool.write_text('#!/bin/sh\necho "update-initramfs $*" >> /var/tmp/update-initramfs.log\n')
    tool.chmod(0o755)
    # Linux 6.15 and later: drivers/gpu/nova-core builds nova_core.ko (Ubuntu compresses modules with zstd)
    module = node / "lib/modules/7.0.0-14-generic/kernel/drivers/gpu/nova-core/nova_core.ko.zst"
    module.parent.mkdir(parents=True)
    module.write_bytes(b"")

    assert run_op(node) == (1, False)
    text = (node / NOUVEAU_CONF.lstrip("/")).read_text()
    assert text == NOUVEAU_TEXT + "blacklist nova_core\n"
    assert (node / initramfs_stamp(NOUVEAU_CONF).lstrip("/")).read_text() == text  # the initramfs has it too
    assert run_op(node) == (0, False)

    module.unlink()  # the kernel that shipped it removed: the line stays (no churn back and forth)
    assert run_op(node) == (0, False)
