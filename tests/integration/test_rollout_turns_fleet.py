"""Rollout turns on three systemd hosts (trixie, containerd 1.7): controller-side hooks around each turn, in
order, a failing hook halting the rollout, hooks never run in a dry run, bad hook data refused before any
node is touched, and a driver reboot taken inside its node's turn only.

The hooks are real programs recording their argv, the ``GPUNODE_`` environment and the time; restarts
and boots are timed from the hosts' own units (the hosts share this machine's clock)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory
from tests.integration.gpu_state import DRIVER, LIBRARY, LIBRARY_DIR, cdi_spec, libnvidia_ml
from tests.integration.summary import summary_rows
from tests.integration.test_gpu_node_fleet import digest, main_pid, running_runtimes, sh, unit_time

REPO = Path(__file__).resolve().parents[2]
NODES = ("tn1", "tn2", "tn3")
pytestmark = pytest.mark.fleet

HOOK = """#!{python}
import json, os, sys, time
which, node = sys.argv[1], sys.argv[2]
with open({log!r}, "a") as log:
    env = {{key: value for key, value in os.environ.items() if key.startswith("GPUNODE_")}}
    log.write(json.dumps({{"t": time.time(), "argv": sys.argv[1:], "env": env}}) + "\\n")
print(f"{{which}}-hook for {{node}} here")
sys.exit(1 if os.environ.get("HOOK_FAILS") == f"{{which}}:{{node}}" else 0)
"""


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    # Names of their own: fleets share network namespaces by host name.
    with fleet_factory.lent([HostSpec(name, "trixie") for name in NODES], "turns") as booted:
        yield booted


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    script = tmp_path / "hook"
    script.write_text(HOOK.format(python=sys.executable, log=str(tmp_path / "hooks.jsonl")))
    script.chmod(0o755)
    return script


def calls(hook: Path) -> list[dict[str, Any]]:
    log = hook.with_name("hooks.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def inventory(fleet: Fleet, tmp_path: Path, hook: Path, **data: Any) -> Path:
    """Every host of the fleet, each with the hooks (and ``data``) as host data."""
    hooks = {
        "gpunode_rollout_before": [str(hook), "before", "{node}", "{hostname}"],
        "gpunode_rollout_after": [str(hook), "after", "{node}", "{hostname}"],
        "gpunode_hook_timeout": 60,
    }
    path = tmp_path / "inventory.py"
    path.write_text(
        "import runpy\n"
        f"data = { ({**hooks, **data})!r}\n"
        f"hosts = [(name, {{**host_data, **data}}) for name, host_data in runpy.run_path({str(fleet.inventory_path)!r})"
        "['hosts']]\n"
    )
    return path


def deploy(inventory_path: Path, *args: str, fails: str = "") -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, inventory_path, "deploys/gpu_node.py", env={"HOOK_FAILS": fails})


def at(call: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(call["t"], UTC)


def untouched(fleet: Fleet) -> dict[str, tuple[str, str]]:
    return {node: (main_pid(fleet, node), digest(fleet, node, "/etc")) for node in NODES}


def summary_row(output: str, node: str) -> str:
    return summary_rows(output)[node]


def test_hooks_wrap_each_turn_in_rollout_order_and_never_run_in_a_dry_run(
    fleet: Fleet, tmp_path: Path, hook: Path
) -> None:
    fleet.reset(NODES)
    sh(fleet, "tn2", "hostname tn2-k8s")  # the Kubernetes node name may differ from the inventory name
    path = inventory(fleet, tmp_path, hook)
    before = untouched(fleet)

    dry = deploy(path, "--dry")
    assert dry.returncode == 0, dry.stdout
    assert calls(hook) == [], "a dry run ran a hook"
    assert untouched(fleet) == before
    assert f"[tn2] plan: before-hook on the controller: {hook} before tn2 tn2-k8s" in dry.stdout
    assert f"[tn2] plan: after-hook on the controller: {hook} after tn2 tn2-k8s" in dry.stdout

    run = deploy(path, "-y")
    assert run.returncode == 0, run.stdout
    made = calls(hook)
    assert [call["argv"] for call in made] == [
        [which, node, "tn2-k8s" if node == "tn2" else node] for node in NODES for which in ("before", "after")
    ]
    for call in made:
        env = call["env"]
        assert env["GPUNODE_NODE"] == call["argv"][1] and env["GPUNODE_HOOK"] == call["argv"][0]
        assert env["GPUNODE_HOSTNAME"] == call["argv"][2] and env["GPUNODE_DRIVER_CHANGE"] == "0"
        assert env["GPUNODE_CHANGES"].startswith(
            "containerd: write /etc/containerd/gpunode/nvidia-runtime.toml, /etc/containerd/config.toml"
        ), env
    # before(n) < restart(n) < after(n) < before(n+1), the restart from the unit's own timestamps
    for index, node in enumerate(NODES):
        first, last = made[2 * index], made[2 * index + 1]
        assert at(first) < unit_time(fleet, node, "ActiveExitTimestamp"), node
        assert unit_time(fleet, node, "ActiveEnterTimestamp") < at(last), node
        if index + 1 < len(NODES):
            assert at(last) < at(made[2 * index + 2])
    assert "tn2] before-hook | before-hook for tn2 here" in run.stdout
    row = summary_row(run.stdout, "tn2")
    assert "done: before-hook, containerd written, containerd restarted and verified, after-hook" in row, row

    again = deploy(path, "-y")
    assert again.returncode == 0, again.stdout
    assert len(calls(hook)) == len(made), "a node with nothing disruptive to do took a turn"


def converged_outside_the_turns(fleet: Fleet, path: Path, hook: Path) -> None:
    """Fresh nodes, and a first run whose first before-hook fails: the steps outside the turns (holds,
    unattended-upgrades and nouveau files) converge on every node, no turn is taken."""
    fleet.reset(NODES)
    pids = {node: main_pid(fleet, node) for node in NODES}
    first = deploy(path, "-y", fails="before:tn1")
    assert first.returncode != 0, first.stdout
    assert [call["argv"][:2] for call in calls(hook)] == [["before", "tn1"]]
    assert {node: main_pid(fleet, node) for node in NODES} == pids
    hook.with_name("hooks.jsonl").unlink()


def test_a_failing_before_hook_leaves_its_node_untouched_and_halts(fleet: Fleet, tmp_path: Path, hook: Path) -> None:
    path = inventory(fleet, tmp_path, hook)
    converged_outside_the_turns(fleet, path, hook)
    before = untouched(fleet)
    result = deploy(path, "-y", fails="before:tn2")
    assert result.returncode != 0, result.stdout
    assert "[tn2] containerd rollout failed: before-hook" in result.stdout
    assert "exited 1" in result.stdout and "the node was not touched" in result.stdout
    assert "halted: not touched after the failure on tn2" in summary_row(result.stdout, "tn3")
    assert [call["argv"][:2] for call in calls(hook)] == [["before", "tn1"], ["after", "tn1"], ["before", "tn2"]]
    assert "nvidia" in running_runtimes(fleet, "tn1")
    after = untouched(fleet)
    assert after["tn2"] == before["tn2"] and after["tn3"] == before["tn3"]


def test_a_failing_after_hook_halts_after_its_node(fleet: Fleet, tmp_path: Path, hook: Path) -> None:
    path = inventory(fleet, tmp_path, hook)
    converged_outside_the_turns(fleet, path, hook)
    before = untouched(fleet)
    result = deploy(path, "-y", fails="after:tn1")
    assert result.returncode != 0, result.stdout
    row = summary_row(result.stdout, "tn1")
    assert "failed: after-hook" in row and "the node was changed: before-hook, containerd written" in row, row
    assert "nvidia" in running_runtimes(fleet, "tn1")  # changed, and reported
    assert [call["argv"][:2] for call in calls(hook)] == [["before", "tn1"], ["after", "tn1"]]
    after = untouched(fleet)
    assert after["tn2"] == before["tn2"] and after["tn3"] == before["tn3"]


def test_a_hook_past_its_timeout_is_killed_and_fails_its_node_untouched(
    fleet: Fleet, tmp_path: Path, hook: Path
) -> None:
    fleet.reset(NODES)
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in NODES}
    path = inventory(fleet, tmp_path, hook, gpunode_rollout_before=["sleep", "60"], gpunode_hook_timeout=1.5)
    result = deploy(path, "-y")
    assert result.returncode != 0, result.stdout
    assert "before-hook sleep timed out after 1.5 s (gpunode_hook_timeout) and was killed" in result.stdout
    assert "halted: not touched after the failure on tn1" in summary_row(result.stdout, "tn2")
    assert {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in NODES} == before


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpunode_rollout_before": "kubectl drain {hostname}"}, "'gpunode_rollout_before' must be list[str]"),
        ({"gpunode_rollout_after": ["no-such-kubectl-here", "uncordon"]}, "program 'no-such-kubectl-here' is not"),
        ({"gpunode_rollout_before": ["true", "{nodename}"]}, "unknown placeholder {nodename}"),
        ({"gpunode_hook_timeout": 0}, "'gpunode_hook_timeout' must be number > 0"),
    ],
)
def test_bad_hook_data_is_refused_before_any_node_is_touched(
    fleet: Fleet, tmp_path: Path, hook: Path, data: dict[str, Any], message: str
) -> None:
    fleet.reset(NODES)
    before = untouched(fleet)
    result = deploy(inventory(fleet, tmp_path, hook, **data), "-y")
    assert result.returncode != 0, result.stdout
    assert message in result.stdout, result.stdout
    assert calls(hook) == [] and untouched(fleet) == before


PLANTED = "/root/gpunode-planted"
OLD_DRIVER = "550.144.03"
# At every boot the node shows the GPU and, as a reboot into the installed driver does, module DRIVER.
BOOT_UNIT = f"""[Unit]
Description=test: the GPU and the driver module a reboot loads
Before=ssh.service containerd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind {PLANTED}/pci /sys/bus/pci/devices
ExecStart=/bin/mount --bind {PLANTED}/boot/module /sys/module
ExecStart=/bin/mount --bind {PLANTED}/boot/proc /proc/driver

[Install]
WantedBy=multi-user.target
"""


def proc_version(version: str) -> str:
    return f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Apr  1 00:00:00 UTC 2025"


@pytest.fixture
def tn2_reboot_pending(fleet: Fleet) -> Iterator[None]:
    """tn2: an H100 whose image driver's userspace (DRIVER) is newer than the loaded module (OLD_DRIVER)."""
    fleet.reset(NODES)
    files = {
        "pci/0000:41:00.0/vendor": "0x10de", "pci/0000:41:00.0/class": "0x030200", "pci/0000:41:00.0/device": "0x2331",
        "now/module/nvidia/version": OLD_DRIVER, "now/proc/nvidia/version": proc_version(OLD_DRIVER),
        "boot/module/nvidia/version": DRIVER, "boot/proc/nvidia/version": proc_version(DRIVER),
    }  # fmt: skip
    script = [f"mkdir -p {PLANTED}/{path.rsplit('/', 1)[0]} && echo '{text}' > {PLANTED}/{path}"
              for path, text in files.items()]  # fmt: skip
    script += [
        f"mount --bind {PLANTED}/pci /sys/bus/pci/devices",
        f"mount --bind {PLANTED}/now/module /sys/module",
        f"mount --bind {PLANTED}/now/proc /proc/driver",
    ]
    try:
        sh(fleet, "tn2", " && ".join(script))
        put(fleet, "tn2", LIBRARY, libnvidia_ml().read_bytes())
        sh(fleet, "tn2", f"echo {LIBRARY_DIR} > /etc/ld.so.conf.d/nvidia.conf && ldconfig")
        ctk = b"#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\n"
        put(fleet, "tn2", "/usr/local/bin/nvidia-ctk", ctk)
        put(fleet, "tn2", "/usr/bin/nvidia-container-runtime", b"#!/bin/sh\n")
        sh(fleet, "tn2", "chmod 755 /usr/local/bin/nvidia-ctk /usr/bin/nvidia-container-runtime")
        put(fleet, "tn2", "/etc/cdi/nvidia.yaml", cdi_spec().encode())
        put(fleet, "tn2", "/etc/systemd/system/gpunode-test-gpu.service", BOOT_UNIT.encode())
        sh(fleet, "tn2", "systemctl enable gpunode-test-gpu.service")
        yield
    finally:
        fleet.reset(NODES)


def put(fleet: Fleet, node: str, path: str, data: bytes) -> None:
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), node, f"mkdir -p $(dirname {path}) && cat > {path}"],
        input=data, capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def boot_id(fleet: Fleet, node: str) -> str:
    return sh(fleet, node, "cat /proc/sys/kernel/random/boot_id").strip()


def booted_at(fleet: Fleet, node: str) -> datetime:
    """When the node's systemd (PID 1) started: the start of its current boot."""
    value = sh(fleet, node, "systemctl show -p UserspaceTimestamp --value --timestamp=us+utc").strip()
    return datetime.strptime(value, "%a %Y-%m-%d %H:%M:%S.%f UTC").replace(tzinfo=UTC)


def test_a_driver_reboot_is_taken_in_its_nodes_turn_only(
    fleet: Fleet, tmp_path: Path, hook: Path, tn2_reboot_pending: None
) -> None:
    path = inventory(fleet, tmp_path, hook, gpunode_reboot=True)
    boots = {node: boot_id(fleet, node) for node in NODES}

    dry = deploy(path, "--dry")
    assert dry.returncode == 0, dry.stdout
    assert f"[tn2] plan: driver: reboot ({OLD_DRIVER} loaded, {DRIVER} installed)" in dry.stdout
    assert calls(hook) == [] and {node: boot_id(fleet, node) for node in NODES} == boots

    run = deploy(path, "-y")
    assert run.returncode == 0, run.stdout
    assert boot_id(fleet, "tn2") != boots["tn2"], "tn2 was not rebooted"
    assert {node: boot_id(fleet, node) for node in ("tn1", "tn3")} == {n: boots[n] for n in ("tn1", "tn3")}
    # logged inside the nested driver step: "nested" in the prefix when tn2 itself conducts the rollout
    assert re.search(rf"\[tn2\] (nested )?driver {re.escape(DRIVER)} loaded after the reboot", run.stdout), run.stdout
    made = {(call["argv"][0], call["argv"][1]): call for call in calls(hook)}
    assert len(made) == 6, calls(hook)
    assert made["before", "tn2"]["env"]["GPUNODE_DRIVER_CHANGE"] == "1"
    assert (made["before", "tn2"]["env"]["GPUNODE_DRIVER_FROM"], made["before", "tn2"]["env"]["GPUNODE_DRIVER_TO"]) == (
        OLD_DRIVER,
        DRIVER,
    )
    assert made["before", "tn2"]["env"]["GPUNODE_CHANGES"].startswith(f"driver: reboot ({OLD_DRIVER} loaded")
    assert made["before", "tn3"]["env"]["GPUNODE_DRIVER_CHANGE"] == "0"
    # tn2 went down after its before-hook and came back before its after-hook; tn3's turn started after that
    assert at(made["after", "tn1"]) < at(made["before", "tn2"]) < booted_at(fleet, "tn2")
    assert booted_at(fleet, "tn2") < unit_time(fleet, "tn2", "ActiveEnterTimestamp") < at(made["after", "tn2"])
    assert at(made["after", "tn2"]) < at(made["before", "tn3"])
    row = summary_row(run.stdout, "tn2")
    assert f"done: before-hook, driver: reboot ({OLD_DRIVER} loaded, {DRIVER} installed)" in row, row
    assert "nvidia" in running_runtimes(fleet, "tn2")


HOSTILE_HOSTNAME = "--selector=kubernetes.io/os=linux"  # an option for kubectl drain: every Linux node


def test_a_hostname_that_is_no_node_name_fails_its_node_before_any_hook(
    fleet: Fleet, tmp_path: Path, hook: Path
) -> None:
    fleet.reset(NODES)
    # hostname(1) refuses it; the kernel takes any name (sethostname), as a compromised node would set it
    sh(fleet, "tn2", f"python3 -c 'import socket, sys; socket.sethostname(sys.argv[1])' '{HOSTILE_HOSTNAME}'")
    assert sh(fleet, "tn2", "uname -n").strip() == HOSTILE_HOSTNAME
    path = inventory(fleet, tmp_path, hook)

    dry = deploy(path, "--dry")
    assert f"[tn2] plan: the node's hostname '{HOSTILE_HOSTNAME}' is not a valid Kubernetes node name" in dry.stdout
    assert f"before-hook on the controller: {hook} before tn2" not in dry.stdout, dry.stdout
    before = (main_pid(fleet, "tn2"), digest(fleet, "tn2", "/etc/containerd"))

    run = deploy(path, "-y")
    assert run.returncode != 0, run.stdout
    assert "is not a valid Kubernetes node name" in summary_row(run.stdout, "tn2")
    assert [call["argv"][:2] for call in calls(hook)] == [["before", "tn1"], ["after", "tn1"]]
    assert all(HOSTILE_HOSTNAME not in value for call in calls(hook) for value in call["env"].values())
    assert (main_pid(fleet, "tn2"), digest(fleet, "tn2", "/etc/containerd")) == before  # its turn never began
    assert "halted: not touched after the failure on tn2" in summary_row(run.stdout, "tn3")


def test_a_node_named_after_another_or_one_machine_under_two_names_takes_no_turn(
    fleet: Fleet, tmp_path: Path, hook: Path
) -> None:
    fleet.reset(NODES)
    tn1 = sh(fleet, "tn1", "uname -n").strip()
    sh(fleet, "tn2", f"hostname {tn1}")  # tn2 names itself after tn1: its hooks would drain tn1
    path = inventory(fleet, tmp_path, hook)
    # tn3's machine under a second inventory name: two turns at once on one machine
    path.write_text(path.read_text() + "hosts.append(('tn3-again', dict(hosts)['tn3']))\n")
    before = {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in NODES}

    dry = deploy(path, "--dry")
    refused = "refused, fails in its slot untouched: "
    assert f"{refused}tn1: Kubernetes node name '{tn1}' is tn2's too" in dry.stdout, dry.stdout
    assert f"{refused}tn2: Kubernetes node name '{tn1}' is tn1's too" in dry.stdout
    machine = ", boot ".join(sh(fleet, "tn3", "cat /etc/machine-id /proc/sys/kernel/random/boot_id").split())
    assert f"{refused}tn3: machine (machine id, boot id) '{machine}' is tn3-again's too" in dry.stdout
    assert f"{refused}tn3-again: machine (machine id, boot id) '{machine}' is tn3's too" in dry.stdout

    run = deploy(path, "-y")
    assert run.returncode != 0, run.stdout
    assert calls(hook) == []  # tn1 failed in its slot first: nothing ran against any node
    assert f"Kubernetes node name '{tn1}' is tn2's too" in summary_row(run.stdout, "tn1")
    assert {node: (main_pid(fleet, node), digest(fleet, node, "/etc/containerd")) for node in NODES} == before

    # A node name in host data the node does not answer to: no hook runs against it.
    named = inventory(fleet, tmp_path, hook)
    named.write_text(
        named.read_text() + "hosts = [(n, {**d, 'gpunode_node_name': 'tn9'} if n == 'tn3' else d) for n, d in hosts]\n"
    )
    dry = deploy(named, "--dry")
    assert "[tn3] plan: gpunode_node_name 'tn9' for tn3 is not the node's name: it reports" in dry.stdout, dry.stdout
    sh(fleet, "tn2", "hostname -F /etc/hostname")


# A before-hook that, in tn1's turn, adds a registry drop-in to tn2: tn2 changes after the run read it.
ADDING_HOOK = """#!{python}
import os, subprocess, sys
if sys.argv[1:3] == ["before", "tn1"] and os.path.exists({armed!r}):
    subprocess.run(["ssh", "-F", {ssh_config!r}, "tn2", "mkdir -p /etc/containerd/conf.d && cat > {registry}"],
                   input={text!r}, text=True, check=True, timeout=60)
"""
DROPIN = "/etc/containerd/gpunode/nvidia-runtime.toml"
REGISTRY = "/etc/containerd/conf.d/50-registry.toml"
REGISTRY_TEXT = (
    'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
)
# tn2's containerd refuses to start once our drop-in carries the registry's key: only the turn's write fails it.
INJECT_FAILURE = (
    "mkdir -p /etc/systemd/system/containerd.service.d && printf '%s\\n' '[Service]' "
    f"'ExecStartPre=/bin/sh -c \"! grep -q certs.d {DROPIN}\"' "
    "> /etc/systemd/system/containerd.service.d/test-failure.conf && systemctl daemon-reload"
)


def test_a_turn_backs_up_what_it_reads_under_its_lock(fleet: Fleet, tmp_path: Path) -> None:
    """tn2 reads as restart-only when the run starts, then gets a registry drop-in before its turn: the
    turn reads it again, backs up before writing our drop-in anew, and restores that backup when the
    restart fails (the run's read would have taken no backup: "this run wrote no containerd config")."""
    fleet.reset(NODES)
    hook = tmp_path / "adding-hook"
    hook.write_text(
        ADDING_HOOK.format(
            python=sys.executable,
            armed=str(tmp_path / "armed"),
            ssh_config=str(fleet.ssh_config_path),
            registry=REGISTRY,
            text=REGISTRY_TEXT,
        )
    )
    hook.chmod(0o755)
    path = inventory(fleet, tmp_path, hook, gpunode_rollout_after=[])
    first = deploy(path, "-y")
    assert first.returncode == 0, first.stdout  # converged
    for node in ("tn1", "tn2"):
        sh(fleet, node, "touch /etc/containerd/config.toml")  # a restart pending, nothing to write
    sh(fleet, "tn2", INJECT_FAILURE)
    (tmp_path / "armed").touch()  # this run's before-hook of tn1 adds tn2's registry drop-in

    run = deploy(path, "-y")
    assert run.returncode != 0, run.stdout
    assert "the config this run wrote was replaced by the backup taken before it" in run.stdout, run.stdout
    assert "this run wrote no containerd config" not in run.stdout
    assert sh(fleet, "tn2", "systemctl is-active containerd").strip() == "active"
    assert "certs.d" not in sh(fleet, "tn2", f"cat {DROPIN}")  # our drop-in as the backup holds it
    assert sh(fleet, "tn2", f"cat {REGISTRY}") == REGISTRY_TEXT  # the user's file kept


CRI_FAILING_DROPIN = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
  endpoint = ["https://registry-1.docker.io"]
"""


def test_an_active_containerd_whose_cri_plugin_failed_takes_a_turn(fleet: Fleet, tmp_path: Path, hook: Path) -> None:
    """tn2's daemon runs, its CRI plugin failed at start (mirrors with config_path), and its files are
    right again and older than the daemon: the turn restarts it and verifies the CRI plugin."""
    path = inventory(fleet, tmp_path, hook)
    fleet.reset(NODES)
    assert deploy(path, "-y").returncode == 0
    hook.with_name("hooks.jsonl").unlink()
    bad = tmp_path / "bad.toml"
    bad.write_text(CRI_FAILING_DROPIN)
    sh(fleet, "tn2", f"cp {DROPIN} /root/good.toml")
    put(fleet, "tn2", DROPIN, CRI_FAILING_DROPIN.encode())
    sh(fleet, "tn2", "systemctl restart containerd")
    assert "failed to load plugin" in sh(
        fleet, "tn2", "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value "
        "containerd) | grep -E 'failed to load plugin io.containerd.grpc.v1.cri' || true"
    )  # fmt: skip
    sh(fleet, "tn2", f"cp /root/good.toml {DROPIN} && touch -d '-1 hour' {DROPIN}")
    assert sh(fleet, "tn2", "systemctl is-active containerd").strip() == "active"

    run = deploy(path, "-y")
    assert run.returncode == 0, run.stdout
    assert "restarting containerd: its CRI plugin failed to load" in run.stdout, run.stdout
    assert [call["argv"][:2] for call in calls(hook)] == [["before", "tn2"], ["after", "tn2"]]
    assert "nvidia" in running_runtimes(fleet, "tn2")
    assert "containerd restarted and verified" in summary_row(run.stdout, "tn2")


def test_a_driver_change_waits_for_its_turn_without_containerd_restarts(
    fleet: Fleet, tmp_path: Path, hook: Path, tn2_reboot_pending: None
) -> None:
    """``gpunode_containerd_restart: none`` writes containerd files without restarts, but tn2's driver
    reboot still takes its turn between its hooks; the other nodes take none."""
    path = inventory(fleet, tmp_path, hook, gpunode_reboot=True, gpunode_containerd_restart="none")
    boots = {node: boot_id(fleet, node) for node in NODES}
    pids = {node: main_pid(fleet, node) for node in ("tn1", "tn3")}

    run = deploy(path, "-y")
    assert run.returncode == 0, run.stdout
    assert boot_id(fleet, "tn2") != boots["tn2"], "tn2 was not rebooted"
    made = {(call["argv"][0], call["argv"][1]): call for call in calls(hook)}
    assert sorted(made) == [("after", "tn2"), ("before", "tn2")], calls(hook)
    assert at(made["before", "tn2"]) < booted_at(fleet, "tn2") < at(made["after", "tn2"])
    assert {node: main_pid(fleet, node) for node in ("tn1", "tn3")} == pids  # files only, no restart
    assert {node: boot_id(fleet, node) for node in ("tn1", "tn3")} == {n: boots[n] for n in ("tn1", "tn3")}
