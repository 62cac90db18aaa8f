"""Canary, batches, failure budget and resume marks as pure logic (no node)."""

from __future__ import annotations

import json

import pytest

from pyinfra_gpunode.hostdata import HostDataError, validate
from pyinfra_gpunode.operations.rollout import _halt_reason
from pyinfra_gpunode.rollout import (
    TURN_MARKER,
    TurnGroup,
    batch_capacity,
    batch_size,
    eta_text,
    halt_lines,
    parse_turn_mark,
    plan_lines,
    progress_line,
    timing_line,
    turn_groups,
    turn_mark_text,
)

NODES = [f"n{k}" for k in range(1, 8)]


@pytest.mark.parametrize(
    ("batch", "nodes", "size"),
    [(1, 400, 1), (5, 3, 5), ("10%", 400, 40), ("10%", 19, 1), ("10%", 5, 1), ("50%", 7, 3), ("100%", 6, 6)],
)
def test_a_batch_is_a_number_or_a_percentage_of_the_run_rounded_down_at_least_one(
    batch: int | str, nodes: int, size: int
) -> None:
    assert batch_size(batch, nodes) == size


@pytest.mark.parametrize("batch", [0, -1, True, "0%", "101%", "10", "10 %", "ten", 2.5, None, [2]])
def test_a_batch_that_is_neither_is_refused_naming_the_key(batch: object) -> None:
    with pytest.raises(HostDataError, match="'gpunode_rollout_batch'"):
        validate({"gpunode_rollout_batch": batch})


@pytest.mark.parametrize("key", ["gpunode_rollout_canary", "gpunode_rollout_max_failed"])
@pytest.mark.parametrize("value", [-1, True, "1", 1.0])
def test_canary_and_budget_are_whole_numbers(key: str, value: object) -> None:
    with pytest.raises(HostDataError, match=f"'{key}'"):
        validate({key: value})
    assert validate({key: 0})[key] == 0


def test_defaults_keep_one_node_at_a_time() -> None:
    values = validate({})
    assert (values["gpunode_rollout_batch"], values["gpunode_rollout_canary"]) == (1, 0)
    assert values["gpunode_rollout_max_failed"] == 0
    assert [group.nodes for group in turn_groups(NODES[:3], 0, 1)] == [("n1",), ("n2",), ("n3",)]


def test_canaries_go_alone_and_first_then_batches_in_order() -> None:
    groups = turn_groups(NODES, 2, 2)
    assert [(group.label, group.nodes) for group in groups] == [
        ("canary 1/2", ("n1",)),
        ("canary 2/2", ("n2",)),
        ("batch 1/3", ("n3", "n4")),
        ("batch 2/3", ("n5", "n6")),
        ("batch 3/3", ("n7",)),
    ]


def test_a_node_caught_mid_turn_goes_alone_before_the_canary() -> None:
    groups = turn_groups(NODES[:5], 1, 3, resumed={"n4"})
    assert [(group.label, group.nodes) for group in groups] == [
        ("resumed 1/1", ("n4",)),
        ("canary 1/1", ("n1",)),
        ("batch 1/1", ("n2", "n3", "n5")),
    ]


def test_nodes_out_of_service_count_against_the_batch_but_never_stop_it() -> None:
    assert batch_capacity(5, 0) == 5
    assert batch_capacity(5, 2) == 3
    assert batch_capacity(5, 9) == 1


def test_nodes_down_until_their_turn_count_against_the_batches_before_it() -> None:
    # n6 is down (containerd failed) until its own turn in the last batch: earlier batches hold one turn less.
    groups = turn_groups(NODES[:6], 0, 3, down={"n6"})
    assert [group.nodes for group in groups] == [("n1", "n2"), ("n3", "n4"), ("n5", "n6")]
    # Two nodes down for good (unreachable, refused) and one until its turn: batches of 1 until n3's.
    groups = turn_groups(NODES[:5], 0, 3, down={"n3"}, already_down=2)
    assert [group.nodes for group in groups] == [("n1",), ("n2",), ("n3",), ("n4",), ("n5",)]
    assert [group.nodes for group in turn_groups(NODES[:4], 0, 4, already_down=1)] == [("n1", "n2", "n3"), ("n4",)]


def test_the_plan_lists_every_group_and_what_is_out_of_service() -> None:
    groups = turn_groups(NODES[:4], 1, 2, already_down=0)
    lines = plan_lines(groups, {"n9": "failed or unreachable before the rollout"}, 3)
    assert lines == [
        "out of service, counted against each batch they are not in (of 3): n9 (failed or unreachable before the "
        "rollout)",
        "canary 1/1: n1",
        "batch 1/2: n2, n3",
        "batch 2/2: n4",
    ]
    assert plan_lines([], {}, 1) == ["no node takes a turn"]


def test_progress_eta_and_timing() -> None:
    group = TurnGroup("batch", 8, 80, ("node-a17",))
    eta = eta_text([48.0, 52.0], 49)
    assert eta == "; ETA 41 min"
    assert progress_line(37, 400, group, "node-a17", "done", 48.2, eta) == (
        "turn 37/400, batch 8/80: node-a17 done in 48 s; ETA 41 min"
    )
    assert eta_text([10.0], 0) == "" and eta_text([10.0], 3) == "; ETA 30 s"
    assert timing_line({"a": 10.0, "b": 30.0, "c": 20.0}, 2, 41.4) == (
        "rollout: 3 turns in 2 groups; median turn 20 s, longest 30 s (b); 41 s in all"
    )
    assert timing_line({}, 0, 0.2) == "rollout: no turn taken; 0 s in all"


def test_the_budget_and_the_canary_halt_the_rollout() -> None:
    canary, batch = TurnGroup("canary", 1, 1, ("n1",)), TurnGroup("batch", 2, 3, ("n4", "n5"))
    assert _halt_reason(canary, ["n1"], 5) == "not touched after the failure on the canary n1"
    assert _halt_reason(batch, [], 0) == ""
    assert _halt_reason(batch, ["n4"], 0) == "not touched after the failure on n4"
    assert _halt_reason(batch, ["n4"], 1) == ""
    assert _halt_reason(batch, ["n2", "n4"], 1) == (
        "not touched after 2 failed turns (n2, n4; gpunode_rollout_max_failed is 1)"
    )
    assert halt_lines(["n4"], ["n6", "n7"])[0] == "rollout halted: failed: n4; not touched: n6, n7"


def test_a_turn_mark_is_read_back_and_an_untrusted_one_never_names_a_backup() -> None:
    backup = "/var/lib/pyinfra-gpunode/backup/containerd-20261201T203700.123456Z.tar"
    text = turn_mark_text("2026-12-01T20:37:00+00:00", backup, "mirrors with config_path")
    mark, problem = parse_turn_mark(text.splitlines())
    assert problem is None and mark is not None
    assert (mark.started, mark.backup, mark.backup_cri_problem) == (
        "2026-12-01T20:37:00+00:00",
        backup,
        "mirrors with config_path",
    )
    assert parse_turn_mark([]) == (None, None)
    for planted in (
        json.dumps({"started": "x", "backup": "/etc/shadow"}),
        json.dumps({"started": "now", "backup": "/var/lib/pyinfra-gpunode/backup/../../../../etc/x.tar"}),
        "not json \x1b[31m",
        "[1, 2]",
    ):
        mark, problem = parse_turn_mark([planted])
        assert mark is not None and mark.backup is None, planted  # still taken first, never restored from
        assert problem is not None and TURN_MARKER in problem and "\x1b" not in problem


def test_a_node_is_out_of_service_when_containerd_is_down_or_its_cri_failed() -> None:
    from pyinfra_gpunode.operations.containerd import Registration
    from pyinfra_gpunode.operations.rollout import _out_of_service

    def found(active: str, reason: str | None = None) -> Registration:
        return Registration(service={"load_state": "loaded", "active_state": active}, restart_reason=reason)  # type: ignore[typeddict-item]

    assert _out_of_service(found("failed", "the unit is failed")) == "containerd failed"
    assert _out_of_service(found("active", "its CRI plugin failed to load: x")) == "its CRI plugin failed"
    assert _out_of_service(found("active", "a config file is newer than the daemon")) is None
    assert _out_of_service(Registration()) is None
