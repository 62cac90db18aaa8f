"""Rollout hooks: argv templates checked (type, placeholders, program), filled in, and their environment."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.hooks import check_hook, hook_argv, hook_environment
from pyinfra_gpunode.hostdata import HostDataError, validate

KEY = "gpunode_rollout_before"


def found(program: str) -> str | None:
    return f"/usr/bin/{program}" if program in ("kubectl", "sh") else None


def test_a_hook_is_an_argv_whose_placeholders_are_filled_in_per_node() -> None:
    argv = check_hook(KEY, ["kubectl", "drain", "{hostname}", "--selector=n={node}", "{{literal}}"], found)
    assert hook_argv(argv, "node1", "gpu-a.example") == [
        "kubectl", "drain", "gpu-a.example", "--selector=n=node1", "{literal}",
    ]  # fmt: skip
    assert check_hook(KEY, [], found) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("kubectl drain {hostname}", "must be a list of strings (the hook's argv), got 'kubectl drain {hostname}'"),
        (["kubectl", 3], "must be a list of strings"),
        (["kubectl", "drain", "{host}"], "unknown placeholder {host} in '{host}' (known: {node}, {hostname})"),
        (["kubectl", "{node.name}"], "unknown placeholder {node.name}"),
        (["kubectl", "drain {"], "unbalanced braces"),
        (["no-such-kubectl", "drain"], "program 'no-such-kubectl' is not found on the controller"),
        (["{node}", "drain"], "the program (first element) must be a plain name"),
        (["", "drain"], "the program (first element) must be a plain name"),
    ],
)
def test_bad_hooks_are_refused_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(HostDataError) as error:
        check_hook(KEY, value, found)
    assert f"host-data key {KEY!r}" in str(error.value) and message in str(error.value)


@pytest.mark.parametrize("timeout", [0, -5, "60", True, None])
def test_a_hook_timeout_must_be_a_positive_number(timeout: object) -> None:
    with pytest.raises(HostDataError, match="host-data key 'gpunode_hook_timeout' must be number > 0"):
        validate({"gpunode_hook_timeout": timeout})
    assert validate({"gpunode_hook_timeout": 2.5})["gpunode_hook_timeout"] == 2.5


def test_the_environment_carries_the_turns_planned_changes() -> None:
    changes = ["driver: reboot (550.144.03 loaded, 550.163.01 installed)", "containerd: restart (config) and verify"]
    driver = ("550.144.03", "550.163.01")
    env = hook_environment({"PATH": "/usr/bin"}, "after", "node2", "gpu-b", changes, "7/40", "batch 3/20", driver)
    assert env == {
        "PATH": "/usr/bin", "GPUNODE_HOOK": "after", "GPUNODE_NODE": "node2", "GPUNODE_HOSTNAME": "gpu-b",
        "GPUNODE_CHANGES": "\n".join(changes), "GPUNODE_DRIVER_CHANGE": "1", "GPUNODE_DRIVER_FROM": "550.144.03",
        "GPUNODE_DRIVER_TO": "550.163.01", "GPUNODE_TURN": "7/40", "GPUNODE_BATCH": "batch 3/20",
    }  # fmt: skip
    # the loaded module's version is the node's text: printable, as the changes that carry it
    odd = hook_environment({}, "before", "n", "h", changes, driver=("550.144.03\x1b[2J", "550.163.01"))
    assert odd["GPUNODE_DRIVER_FROM"] == "550.144.03<U+001B>[2J"
    unchanged = hook_environment({}, "before", "n", "h", changes[1:])
    assert (unchanged["GPUNODE_DRIVER_CHANGE"], unchanged["GPUNODE_DRIVER_FROM"], unchanged["GPUNODE_DRIVER_TO"]) == (
        "0",
        "",
        "",
    )
