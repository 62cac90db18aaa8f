"""Which Kubernetes node a host is, decided on the controller's side: host data checked against what
the node reports, the kubelet's own override read from its real flag-file forms, and no two hosts of a
run sharing a node name or a machine."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.facts.identity import NodeIdentity
from pyinfra_gpunode.hostdata import HostDataError, validate
from pyinfra_gpunode.node_identity import kubelet_override, machine_id, machine_of, node_name, reported, shared

# kubeadm's /var/lib/kubelet/kubeadm-flags.env as `kubeadm join` writes it (kubernetes/kubernetes,
# cmd/kubeadm/app/phases/kubelet/flags.go: KUBELET_KUBEADM_ARGS="..."), with nodeRegistration.name set.
KUBEADM_FLAGS = (
    'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock '
    '--hostname-override=gpu-a.cluster.internal --pod-infra-container-image=registry.k8s.io/pause:3.10"'
)
# /etc/default/kubelet as Debian-based image builders write KUBELET_EXTRA_ARGS (a space, not '=').
EXTRA_ARGS = "KUBELET_EXTRA_ARGS='--node-ip=10.0.0.5 --hostname-override gpu-b'"


def test_the_kubelet_override_is_read_from_its_flag_files() -> None:
    assert kubelet_override([KUBEADM_FLAGS]) == "gpu-a.cluster.internal"
    assert kubelet_override([EXTRA_ARGS]) == "gpu-b"
    assert kubelet_override([KUBEADM_FLAGS, EXTRA_ARGS]) == "gpu-b"  # the last one, as the kubelet takes it
    assert kubelet_override(['KUBELET_KUBEADM_ARGS="--node-ip=10.0.0.5"']) is None
    assert kubelet_override([]) is None


def test_a_machine_id_is_32_hex_digits_or_none() -> None:
    assert machine_id("4c4c4544004d3510804bb4c04f4e3732\n") == "4c4c4544004d3510804bb4c04f4e3732"
    for text in ("", "uninitialized", "x" * 32, "4c4c4544004d3510804bb4c04f4e373"):
        assert machine_id(text) == ""


def test_the_node_name_is_the_host_data_s_where_the_node_answers_to_it() -> None:
    assert node_name("10.0.0.5", "gpu-a", reported("gpu-a")) == ("gpu-a", None)
    assert node_name("10.0.0.5", "gpu-a", reported("GPU-A")) == ("gpu-a", None)  # the kubelet lowercases it
    assert node_name("10.0.0.5", "gpu-a.x", reported("gpu-a", "gpu-a.x")) == ("gpu-a.x", None)
    name, why = node_name("gpu-a", "gpu-a", reported("gpu-b"))  # the node named itself after another
    assert name == ""
    assert why == (
        "gpunode_node_name 'gpu-a' for gpu-a is not the node's name: it reports 'gpu-b' (hostname, kubelet "
        "--hostname-override); no hook runs against a node that may be another"
    )


def test_without_host_data_the_node_s_report_is_its_name_where_valid() -> None:
    assert node_name("10.0.0.5", None, reported("gpu-a")) == ("gpu-a", None)
    assert node_name("10.0.0.5", None, reported("gpu-a", "gpu-a.x")) == ("gpu-a.x", None)
    name, why = node_name("10.0.0.5", None, reported("--selector=x"))
    assert name == "" and why is not None and "not a valid Kubernetes node name" in why


def test_a_machine_shared_by_many_names_lists_a_few() -> None:
    problems = shared({f"n{index}": "m" for index in range(8)}, "machine")
    assert (
        problems["n0"]
        == "machine 'm' is n1, n2, n3, n4, n5 and 2 more's too: no turn for either until each is one node"
    )


def test_a_name_or_machine_two_hosts_share_refuses_both_naming_the_other() -> None:
    problems = shared({"a": "gpu-b", "b": "gpu-b", "c": "gpu-c", "d": "", "e": ""}, "Kubernetes node name")
    assert problems == {
        "a": "Kubernetes node name 'gpu-b' is b's too: no turn for either until each is one node",
        "b": "Kubernetes node name 'gpu-b' is a's too: no turn for either until each is one node",
    }


@pytest.mark.parametrize("value", ["GPU-A", "-a", "a_b", "", "a" * 254, 5])
def test_a_host_data_node_name_that_is_no_node_name_is_refused(value: object) -> None:
    with pytest.raises(HostDataError, match="gpunode_node_name"):
        validate({"gpunode_node_name": value})


def test_the_fact_reads_bounded_lines() -> None:
    command = NodeIdentity().command()
    assert "head -c 300" in command and "head -c 64 /etc/machine-id" in command and "-m 20" in command
    boot = "0f6a1c52-8d0e-4f4b-9d1e-3c2f5a7b9e10"
    found = NodeIdentity().process(
        ["@@hostname", "gpu-a", "@@machine_id", "4c4c4544004d3510804bb4c04f4e3732", "@@boot_id", boot,
         "@@kubelet", KUBEADM_FLAGS]
    )  # fmt: skip
    assert found == reported("gpu-a", "gpu-a.cluster.internal", "4c4c4544004d3510804bb4c04f4e3732", boot)
    assert machine_of(found) == f"4c4c4544004d3510804bb4c04f4e3732, boot {boot}"
    assert machine_of(reported("gpu-a")) == ""  # no machine id: never shared
