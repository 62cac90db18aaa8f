"""Values read from a node on their way to the controller's hooks: the hostname must be a Kubernetes node
name, the planned changes one printable line each."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.hooks import hook_argv, hook_environment, node_name_problem
from pyinfra_gpunode.log import shown
from pyinfra_gpunode.node_identity import hook_name, reported


@pytest.mark.parametrize("name", ["gpu-a17", "tn2-k8s", "ip-10-0-1-17.ec2.internal", "a", "0", "a" * 253])
def test_kubernetes_node_names_are_accepted(name: str) -> None:
    assert node_name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "--selector=kubernetes.io/os=linux",  # an option for kubectl drain and uncordon
        "-l",
        "GPU-A17",  # the kubelet registers lowercase names: uppercase is not the node's name
        "gpu a17",
        "gpu-a17\n--all",
        "gpu-a17.",
        ".gpu",
        "gpu..a17",
        "gpu_a17",
        "",
        "a" * 254,
        "node\x1b[2Jcleared",
    ],
)
def test_other_hostnames_are_refused_and_shown_escaped(name: str) -> None:
    problem = node_name_problem(name)
    assert problem is not None and "is not a valid Kubernetes node name" in problem
    assert "\n" not in problem and "\x1b" not in problem
    assert problem.isprintable()


def test_a_long_hostname_is_shown_cut_with_its_length() -> None:
    assert shown("x" * 300) == "'" + "x" * 80 + "'… (300 characters)"
    assert shown("a\nb\x1bc") == "'a<U+000A>b<U+001B>c'"


def test_planned_changes_reach_the_hook_as_printable_lines() -> None:
    changes = ["driver: install 580.95.05\x1b[31m", "containerd: restart (a\nb) and verify"]
    env = hook_environment({}, "before", "n1", "n1", changes)
    assert env["GPUNODE_CHANGES"].splitlines() == [
        "driver: install 580.95.05<U+001B>[31m",
        "containerd: restart (a<U+000A>b) and verify",
    ]
    assert hook_argv(["kubectl", "drain", "{hostname}"], "n1", "gpu-a17") == ["kubectl", "drain", "gpu-a17"]


@pytest.mark.parametrize(
    ("hooks", "name", "expected"),
    [
        (["kubectl", "drain", "{node}"], "gpu-b", ("gpu-b", None)),  # GPUNODE_HOSTNAME set all the same
        (["kubectl", "drain", "{hostname}"], "gpu-b", ("gpu-b", None)),
        (["kubectl", "drain", "{node}"], "gpu_b", ("", None)),  # no hook names it: not refused, not given
        (["kubectl", "drain", "{hostname}"], "GPU-B", ("gpu-b", None)),  # lowercased, as the kubelet does
    ],
)
def test_every_hook_gets_the_hostname_where_it_is_a_node_name(
    hooks: list[str], name: str, expected: tuple[str, None]
) -> None:
    assert hook_name("n1", None, hooks, reported(name)) == expected


def test_a_hostname_a_hook_names_is_refused_where_it_is_no_node_name() -> None:
    hostname, refused = hook_name("n1", None, ["x", "{hostname}"], reported("gpu_b"))
    assert hostname == "" and refused is not None and "not a valid Kubernetes node name" in refused


def test_a_node_without_hooks_is_not_read() -> None:
    from pyinfra_gpunode.operations.rollout import _hook_hostname

    assert _hook_hostname(None, {"before": [], "after": [], "node_name": "gpu-a"}) == ("", None)  # type: ignore[arg-type, typeddict-item]
