"""deploys/readiness.py on systemd test hosts without a GPU (containerd 1.7 and 2.1): a healthy node is
ready with its GPU links not applicable, each containerd-side broken link is told apart with its
cause, the exit status follows, and neither ``-y`` nor ``--dry`` changes a byte or restarts containerd."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory
from tests.integration.test_gpu_node_fleet import digest, main_pid, sh, write
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS, registry, toolkit_dropin

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.fleet

# rd1: trixie, containerd 1.7; rd2: sid, containerd 2.1. Names of their own: fleets share network namespaces by name.
HOSTS = (HostSpec("rd1", "trixie"), HostSpec("rd2", "sid"))
NVIDIA_2X = (
    '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
    '  runtime_type = "io.containerd.runc.v2"\n'
    '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]\n'
    '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
)
# On 1.7 a drop-in with only the nvidia runtime replaces the runtimes map: runc, the default, is gone.
NVIDIA_ONLY_1X = (
    'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
    '  runtime_type = "io.containerd.runc.v2"\n'
)
CRI_STARTED = (
    "id=$(systemctl show -p InvocationID --value containerd); for i in $(seq 100); do "
    'journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" | '
    "grep -qE 'Start cri plugin with config|starting cri plugin|failed to load plugin' && exit 0; sleep 0.1; "
    "done; exit 1"
)


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    with fleet_factory.lent(HOSTS, "readiness") as booted:
        yield booted


def restarted(fleet: Fleet, node: str) -> None:
    sh(fleet, node, "systemctl restart containerd")
    sh(fleet, node, CRI_STARTED)


def register_nvidia(fleet: Fleet, node: str) -> None:
    """The nvidia runtime as the toolkit registers it (1.7) or as a 2.x drop-in, loaded by a restart."""
    if node == "rd1":
        write(fleet, node, CONFIG, "version = 2\n" + IMPORTS)
        write(fleet, node, f"{CONFD}/99-nvidia.toml", toolkit_dropin())
    else:
        write(fleet, node, CONFIG, "version = 3\n" + IMPORTS)
        write(fleet, node, f"{CONFD}/99-nvidia.toml", "version = 3\n" + NVIDIA_2X)
    restarted(fleet, node)


def untouched(fleet: Fleet, node: str) -> tuple[str, str, str]:
    return digest(fleet, node, "/etc"), digest(fleet, node, "/var/lib"), main_pid(fleet, node)


def readiness(fleet: Fleet, tmp_path: Path, node: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """The CLI on ``node``: its process (stderr merged) and the JSON report it wrote."""
    report = tmp_path / f"readiness{len(list(tmp_path.iterdir()))}.json"
    result = cli.pyinfra(
        *args, "--limit", node, "--data", f"gpunode_readiness_json={report}", fleet.inventory_path,
        "deploys/readiness.py", timeout=300,
    )  # fmt: skip
    return result, json.loads(report.read_text())


def stable(document: dict[str, Any]) -> dict[str, Any]:
    """A report less what differs from run to run: the run's id and times, each node's time of reading."""
    nodes = [{key: value for key, value in node.items() if key != "read_at"} for node in document["nodes"]]
    return {**document, "run": None, "nodes": nodes}


def chain(output: str) -> str:
    """The readiness block of the CLI's output: every node's chain and the fleet summary."""
    block = output.split("--> Readiness\n", 1)[1]
    return block.split("\n--> Readiness report written", 1)[0]


def assert_table_matches_json(output: str, document: dict[str, Any]) -> None:
    for node in document["nodes"]:
        for link in node["links"]:
            assert f"  {link['state']:<7} {link['id']:<23}  {link['detail']}\n" in output, (node["node"], link)
        if not node["ready"]:
            assert f"  cause: {node['cause']}\n  fix:   {node['fix']}" in output


def test_healthy_nodes_without_gpu_are_ready_and_untouched(fleet: Fleet, tmp_path: Path) -> None:
    fleet.reset(["rd1", "rd2"])
    for node in ("rd1", "rd2"):
        register_nvidia(fleet, node)
        before = untouched(fleet, node)
        run, document = readiness(fleet, tmp_path, node, "-y")
        dry, dry_document = readiness(fleet, tmp_path, node, "--dry")
        assert untouched(fleet, node) == before, f"{node}: the report changed the node"

        assert run.returncode == 0 and dry.returncode == 0, run.stdout
        assert chain(run.stdout) == chain(dry.stdout) and stable(document) == stable(dry_document)
        assert "1 of 1 nodes ready" in run.stdout
        (found,) = document["nodes"]
        states = {link["id"]: link["state"] for link in found["links"]}
        containerd_side = ("containerd", "runtime_")  # the links a node without a GPU has too
        assert {states[name] for name in states if not name.startswith(containerd_side)} == {"n/a"}
        assert {states[name] for name in states if name.startswith(containerd_side)} == {"ok"}
        assert states["containerd_config"] == states["containerd_running"] == states["containerd_restarts"] == "ok"
        assert found["versions"]["containerd"].startswith("1.7." if node == "rd1" else "2.1.")
        assert_table_matches_json(run.stdout, document)


def shadowed(fleet: Fleet) -> None:
    """The field incident: the toolkit's 99-nvidia.toml, then a registry drop-in that replaces the CRI section."""
    write(fleet, "rd1", CONFIG, "version = 2\n" + IMPORTS)
    write(fleet, "rd1", f"{CONFD}/99-nvidia.toml", toolkit_dropin())
    write(fleet, "rd1", f"{CONFD}/99-registry.toml", registry("/etc/containerd/certs.d"))
    restarted(fleet, "rd1")


def restart_pending(fleet: Fleet) -> None:
    write(fleet, "rd1", CONFIG, "version = 2\n" + IMPORTS)
    write(fleet, "rd1", f"{CONFD}/99-nvidia.toml", toolkit_dropin())


def cri_failed(fleet: Fleet) -> None:
    write(fleet, "rd1", CONFIG, "version = 2\n" + IMPORTS)
    write(fleet, "rd1", f"{CONFD}/50-nvidia.toml", NVIDIA_ONLY_1X)
    restarted(fleet, "rd1")
    assert sh(fleet, "rd1", "systemctl is-active containerd").strip() == "active"


def sighup(fleet: Fleet) -> None:
    register_nvidia(fleet, "rd1")
    before = main_pid(fleet, "rd1")
    sh(fleet, "rd1", "systemctl kill -s HUP containerd")
    deadline = time.monotonic() + 30
    active = "systemctl is-active containerd || true"
    while main_pid(fleet, "rd1") in ("0", before) or sh(fleet, "rd1", active) != "active\n":
        assert time.monotonic() < deadline, "containerd did not come back after SIGHUP"
        time.sleep(0.2)
    sh(fleet, "rd1", CRI_STARTED)


SCENARIOS: dict[str, tuple[Callable[[Fleet], None], str, str]] = {
    "shadowed": (
        shadowed,
        "containerd_config",
        "/etc/containerd/conf.d/99-nvidia.toml defines the nvidia runtime but /etc/containerd/conf.d/99-registry.toml, "
        "loaded after it, also sets the CRI plugin and containerd 1.7 keeps only the last file's CRI section",
    ),
    "restart_pending": (
        restart_pending,
        "containerd_running",
        "restart pending: /etc/containerd/conf.d/99-nvidia.toml, /etc/containerd/config.toml changed after containerd",
    ),
    "cri_failed": (
        cri_failed,
        "containerd_running",
        "failed to load its CRI plugin: invalid plugin config: no corresponding runtime configured in "
        '`containerd.runtimes` for `containerd` `default_runtime_name = "runc"',
    ),
    "sighup": (sighup, "containerd_restarts", "containerd was sent SIGHUP 1 time(s) (first "),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_broken_containerd_link_is_named_with_its_cause_and_nothing_changes(
    fleet: Fleet, tmp_path: Path, scenario: str
) -> None:
    setup, link, cause = SCENARIOS[scenario]
    fleet.reset(["rd1"])
    setup(fleet)
    before = untouched(fleet, "rd1")
    run, document = readiness(fleet, tmp_path, "rd1", "-y")
    dry, dry_document = readiness(fleet, tmp_path, "rd1", "--dry")
    assert untouched(fleet, "rd1") == before, "the report changed the node"

    (found,) = document["nodes"]
    assert (found["ready"], found["first_broken"]) == (False, link), json.dumps(found, indent=2)
    assert cause in found["cause"]
    assert run.returncode != 0 and f"node not ready at {link}: " in run.stdout
    assert dry.returncode == 0 and chain(run.stdout) == chain(dry.stdout) and stable(document) == stable(dry_document)
    assert f"0 of 1 nodes ready\n  {link}: rd1" in run.stdout
    assert_table_matches_json(run.stdout, document)


def test_gpu_node_deploy_prints_each_nodes_chain_after_the_rollout(fleet: Fleet) -> None:
    fleet.reset(["rd1", "rd2"])
    run = cli.pyinfra("-y", fleet.inventory_path, "deploys/gpu_node.py")
    assert run.returncode == 0, run.stdout
    summary = run.stdout.index("--> Summary (rollout order)")
    report = chain(run.stdout[summary:])
    assert report.startswith("rd1: ready\n") and "\nrd2: ready\n" in report, report
    assert "2 of 2 nodes ready\n" in report


def test_unwritable_json_path_fails_every_node_naming_the_key(fleet: Fleet, tmp_path: Path) -> None:
    before = untouched(fleet, "rd1")
    target = tmp_path / "missing" / "report.json"
    run = cli.pyinfra(
        "-y", "--data", f"gpunode_readiness_json={target}", fleet.inventory_path, "deploys/readiness.py", timeout=300
    )
    assert run.returncode != 0 and "Traceback" not in run.stdout
    message = "host-data key 'gpunode_readiness_json' must name a file in a writable directory on the controller"
    assert run.stdout.count(message) == 2 and "--> Readiness" not in run.stdout
    assert not target.parent.exists() and untouched(fleet, "rd1") == before
