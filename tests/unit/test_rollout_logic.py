"""Pure logic of the rollout: order, per-node settings, units refused, restart verification, the summary table."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dump import (
    CTR,
    JOURNAL,
    expected_after_restart,
    parse_cri_loaded,
    parse_cri_start_log,
    restart_problem,
    summarize,
)
from pyinfra_gpunode.hostdata import HostDataError
from pyinfra_gpunode.rollout import (
    FILES_ONLY,
    NOT_IN_ORDER,
    UNCHANGED,
    NodeReport,
    Outcome,
    OutcomeKind,
    node_settings,
    rollout_order,
    summary_table,
    unit_problem,
)

INVENTORY = ["node1", "node2", "node3"]
SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def test_inventory_order_unless_hosts_go_first() -> None:
    assert rollout_order(INVENTORY, []) == INVENTORY
    assert rollout_order(INVENTORY, ["node3"]) == ["node3", "node1", "node2"]
    assert rollout_order(INVENTORY, ["node2", "node1"]) == ["node2", "node1", "node3"]


@pytest.mark.parametrize(("first", "message"), [(["node9"], "node9"), (["node1", "node1"], "twice: node1")])
def test_bad_rollout_order_names_the_key(first: list[str], message: str) -> None:
    with pytest.raises(HostDataError, match=f"'gpunode_rollout_order'.*{message}"):
        rollout_order(INVENTORY, first)


def _loaded(runtimes: list[str], default: str = "runc", path: str | None = "/etc/containerd/certs.d"):
    loaded = parse_cri_start_log([])
    return {
        **loaded,
        "loaded": True,
        "runtimes": runtimes,
        "default_runtime_name": default,
        "registry_config_path": path,
    }


def test_restart_verified_against_dump_and_previous_daemon() -> None:
    previous = _loaded(["runc", "kata"])
    summary = {
        **summarize({}),
        "runtimes": {"runc": {}, "nvidia": {}},
        "default_runtime_name": "runc",
        "registry_config_path": "/etc/containerd/certs.d",
    }
    expected = expected_after_restart(summary, previous)  # type: ignore[arg-type]
    assert expected["runtimes"] == ["kata", "nvidia", "runc"]
    assert restart_problem("active", "success", _loaded(["kata", "nvidia", "runc"]), expected) is None
    assert "lacks runtimes kata" in (restart_problem("active", "success", _loaded(["nvidia", "runc"]), expected) or "")
    assert "default runtime is 'nvidia'" in (
        restart_problem("active", "success", _loaded(["kata", "nvidia", "runc"], default="nvidia"), expected) or ""
    )
    # 2.x does not log the registry path: not a problem; 1.x logging another one is
    assert restart_problem("active", "success", _loaded(["kata", "nvidia", "runc"], path=None), expected) is None
    assert "config_path" in (
        restart_problem("active", "success", _loaded(["kata", "nvidia", "runc"], path="/x"), expected) or ""
    )


def test_restart_problem_names_unit_state_and_cri_failure() -> None:
    expected = _loaded(["runc"])
    assert restart_problem("failed", "start-limit-hit", _loaded(["runc"]), expected) == (
        "the unit is failed (result start-limit-hit)"
    )
    failed = parse_cri_start_log((SAMPLES / "cri-failed-1.7.24.log").read_text().splitlines())
    assert "did not load" in (restart_problem("active", "success", failed, expected) or "")


def test_summary_table_has_a_block_per_node_in_order() -> None:
    table = summary_table(
        {
            "node2": NodeReport(changed=["kernel: held"], rollout="done"),
            "node1": NodeReport(skipped=["CDI: reboot pending"], pending=["reboot"], rollout="halted: x"),
        }
    )
    assert table.splitlines() == [
        "node2  done",
        "    changed: kernel: held",
        "node1  halted: x",
        "    skipped: CDI: reboot pending",
        "    pending: reboot",
    ]


def test_summary_table_fits_100_columns_and_keeps_every_word() -> None:
    changed = [f"step {n}: something changed on the node with a long description" for n in range(8)]
    reports = {
        "gpu-node-01.example.internal": NodeReport(
            changed=changed,
            skipped=["driver 580.159.04 (proprietary) preinstalled", "Fabric Manager: no NVSwitch"],
            pending=["reboot: driver 550.163.01 installed, no module loaded"],
            rollout="done: before-hook, driver: reboot (550.163.01 loaded, 580.95.05 installed), containerd written, "
            "containerd restarted and verified, after-hook",
        ),
        "n" * 70: NodeReport(rollout="halted: not touched after the failure on gpu-node-01.example.internal"),
        "/" + "x" * 130: NodeReport(rollout="unchanged"),  # a node name longer than the terminal is not cut
    }
    table = summary_table(reports)
    lines = table.splitlines()
    assert [line for line in lines if len(line) > 100] == ["/" + "x" * 130], table
    assert lines[0].startswith("gpu-node-01.example.internal  done: before-hook, driver: reboot"), table
    assert lines[-2:] == ["/" + "x" * 130, "    unchanged"], table
    # Wrapped at spaces only: the words read back in order.
    words = " ".join(table.split())
    assert "changed: " + ", ".join(changed) in words
    assert "skipped: driver 580.159.04 (proprietary) preinstalled; Fabric Manager: no NVSwitch" in words
    assert "n" * 70 + " halted: not touched after the failure on gpu-node-01.example.internal" in words


CTR_OK_1_7 = ["io.containerd.grpc.v1                  cri                      linux/amd64    ok        "]
CTR_ERROR_1_7 = [
    "io.containerd.grpc.v1                  cri                      linux/amd64    error     ",
    "               Message:     invalid plugin config: no corresponding runtime configured in `containerd.runtimes`",
]


def test_cri_read_from_ctr_when_the_journal_has_no_start_line() -> None:
    """``[debug] level = "warn"``: no start line; ``ctr plugins ls`` still tells ok from error."""
    ok = parse_cri_loaded([], CTR_OK_1_7)
    assert ok["loaded"] and ok["source"] == CTR and ok["runtimes"] == []
    # only the plugin's status is known: active and ok verifies, whatever the dump expects
    assert restart_problem("active", "success", ok, _loaded(["nvidia", "runc"])) is None
    error = parse_cri_loaded([], CTR_ERROR_1_7)
    assert not error["loaded"] and "no corresponding runtime configured" in (error["error"] or "")
    assert "did not load: ctr plugins ls: invalid plugin config" in (
        restart_problem("active", "success", error, _loaded(["runc"])) or ""
    )
    # the journal's start line wins where there is one; nothing at all is not "loaded"
    logged = parse_cri_loaded((SAMPLES / "cri-failed-1.7.24.log").read_text().splitlines(), CTR_OK_1_7)
    assert logged["source"] == JOURNAL and not logged["loaded"]
    assert not parse_cri_loaded([], [])["loaded"]


def _service(**values: object) -> dict[str, object]:
    return {
        "load_state": "loaded",
        "triggered_by": [],
        "processes": [{"pid": 73, "unit": "containerd.service"}],
        **values,
    }


def test_units_that_cannot_be_restarted_are_refused_naming_what_was_found() -> None:
    assert unit_problem(_service()) is None
    assert "no /run/systemd/system" in (unit_problem(None) or "")
    other = unit_problem(_service(load_state="not-found", processes=[{"pid": 812, "unit": "k3s.service"}]))
    assert other and "containerd.service is not-found (containerd runs as pid 812 in k3s.service)" in other
    assert "no containerd process runs" in (unit_problem(_service(load_state="not-found", processes=[])) or "")
    assert "socket-activated by containerd.socket" in (unit_problem(_service(triggered_by=["containerd.socket"])) or "")
    second = unit_problem(_service(processes=[{"pid": 73, "unit": "containerd.service"}, {"pid": 90, "unit": ""}]))
    assert second and "pid 90 in no unit" in second


def test_each_node_has_its_own_settings_and_unlisted_nodes_the_defaults() -> None:
    nodes = {"node3": {"runtime": {"binary": "/opt/c"}, "timeout": 20, "restart": "none"}}
    no_turn = {"before": [], "after": [], "hook_timeout": 600.0, "node_name": None, "driver": [], "steps": None,
               "driver_versions": ("", "")}  # fmt: skip
    assert node_settings(nodes, "node3") == {
        "runtime": {"binary": "/opt/c"}, "timeout": 20, "restart": "none", **no_turn,
    }  # fmt: skip
    assert node_settings(nodes, "node1") == {"runtime": {}, "timeout": 60, "restart": "rolling", **no_turn}


def test_a_2x_cri_plugin_that_failed_after_its_start_line_is_read_as_failed() -> None:
    """containerd 2.1.9 logs ``starting cri plugin`` first, then ``msg="failed to load plugin" … id=…``
    (a real journal: registry mirrors with config_path), which the node's own grep must keep too."""
    lines = (SAMPLES / "cri-failed-2.1.9.log").read_text().splitlines()
    assert any("starting cri plugin" in line for line in lines)
    failed = parse_cri_start_log(lines)
    assert failed["loaded"] is False
    assert "`mirrors` cannot be set when `config_path` is provided" in (failed["error"] or "")
    assert "did not load" in (restart_problem("active", "success", failed, _loaded(["runc"])) or "")


def test_the_cri_read_keeps_both_failure_forms_and_no_other_plugins_failure() -> None:
    from pyinfra_gpunode.facts.containerd import CRI_LINES, ContainerdCriLoaded

    assert CRI_LINES in ContainerdCriLoaded().command()  # one of its arguments
    grep = ["grep", "-E", CRI_LINES]
    kept = subprocess.run(
        grep,
        input="\n".join(
            [
                *(SAMPLES / "cri-failed-2.1.9.log").read_text().splitlines(),
                *(SAMPLES / "cri-failed-1.7.24.log").read_text().splitlines(),
                'time="t" level=warning msg="failed to load plugin" error="no btrfs" '
                "id=io.containerd.snapshotter.v1.btrfs type=io.containerd.snapshotter.v1",
            ]
        ),
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert sum("failed to load plugin" in line for line in kept) == 3, kept  # 2.x: images and cri; 1.x: cri
    assert not any("btrfs" in line for line in kept)


def test_outcomes_are_typed_and_print_as_the_log_and_summary_show_them() -> None:
    done = Outcome.done(["before-hook", "containerd written", "containerd restarted and verified"])
    assert (done.kind, str(done)) == (
        OutcomeKind.DONE, "done: before-hook, containerd written, containerd restarted and verified",
    )  # fmt: skip
    assert Outcome.done([]) == UNCHANGED and str(UNCHANGED) == "unchanged"
    failed = Outcome.failed("before-hook kubectl exited 1; the node was not touched")
    assert (failed.kind, str(failed)) == (
        OutcomeKind.FAILED,
        "failed: before-hook kubectl exited 1; the node was not touched",
    )
    halted = Outcome.halted("not touched after the failure on node2")
    assert str(halted) == "halted: not touched after the failure on node2"
    assert str(FILES_ONLY) == "files only (gpunode_containerd_restart: none)"
    assert str(NOT_IN_ORDER) == "not in the rollout order"
    assert (
        f"containerd rollout {failed}"
        == "containerd rollout failed: before-hook kubectl exited 1; the node was not touched"
    )
