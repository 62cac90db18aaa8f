"""Pure logic of the rollout: a node whose current config would not start the CRI plugin takes no turn into it."""

from __future__ import annotations

from pyinfra_gpunode.operations.containerd import Registration
from pyinfra_gpunode.operations.rollout import _cri_refusal
from pyinfra_gpunode.rollout import node_settings

BAD = 'plugins."io.containerd.cri.v1.images".registry.mirrors (docker.io; in /etc/containerd/config.toml) ...'
ROLLING = node_settings({}, "node1")
DRIVER = node_settings({"node1": {"driver": ["driver: reboot into 580"]}}, "node1")


def test_a_restart_into_the_current_config_is_refused_naming_it() -> None:
    pending = Registration(restart_reason="its config is newer than the daemon", current_cri_problem=BAD)
    refusal = _cri_refusal(pending, ROLLING)
    assert refusal == (
        "its containerd config would not start the CRI plugin, so containerd is not restarted into it: " + BAD
    )
    # A driver change reboots the node (containerd restarts into its files) before anything is written.
    writes = Registration(writes={"/etc/containerd/config.toml": "x"}, current_cri_problem=BAD)
    assert _cri_refusal(writes, DRIVER) is not None


def test_nothing_to_do_or_a_write_the_rules_passed_is_not_refused() -> None:
    assert _cri_refusal(Registration(current_cri_problem=BAD), ROLLING) is None  # no turn: nothing restarts
    writes = Registration(writes={"/etc/containerd/config.toml": "x"}, current_cri_problem=BAD)
    assert _cri_refusal(writes, ROLLING) is None  # the turn restarts into the written, judged config
    refused = Registration(problem="containerd config not changed: ...", current_cri_problem=BAD)
    assert _cri_refusal(refused, DRIVER) is None  # the candidate's own refusal fails the node, before any step
    fine = Registration(restart_reason="its config is newer than the daemon")
    assert _cri_refusal(fine, ROLLING) is None
