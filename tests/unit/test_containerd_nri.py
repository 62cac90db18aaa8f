"""NRI mode (``gpunode_containerd_mode: nri``): the drop-in turns on containerd's NRI plugin and CDI and
registers no runtime; a file's NRI setting is kept unless host data asks; the gate, the restart check and
the readiness report ask for NRI and CDI instead of the nvidia runtime."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from pyinfra_gpunode.containerd_dropin import NRI, OUR_DROPIN, Options, Plan, plan
from pyinfra_gpunode.containerd_dump import (
    candidate_losses,
    expected_after_restart,
    nri_losses,
    nri_state,
    parse_cri_start_log,
    summarize,
)
from pyinfra_gpunode.hostdata import HostDataError, validate
from pyinfra_gpunode.memo import copied
from pyinfra_gpunode.readiness import BROKEN, NOT_APPLICABLE, OK, assess
from pyinfra_gpunode.versions import parse_containerd_version
from tests.unit.test_readiness import BINARY, SPEC, healthy

MAIN = "/etc/containerd/config.toml"
CONFD = "/etc/containerd/conf.d"
SITE = f"{CONFD}/50-site.toml"
IMPORTS = f'imports = ["{CONFD}/*.toml"]\n'
V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"
V16 = parse_containerd_version("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3")
V17 = parse_containerd_version("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1")
V21 = parse_containerd_version("containerd github.com/containerd/containerd/v2 2.1.9+unknown ")
NRI_MODE = Options(mode="nri")
MODE_LINE = "NRI mode: no nvidia runtime registered; NRI and CDI enabled, for the GPU Operator's NRI plugin"
# (containerd, config.toml's version, the CRI plugin name our file writes)
CASES = [(V17, 2, V2), (V21, 2, V2), (V21, 3, V3)]


def written(result: Plan) -> dict[str, Any]:
    assert not result.errors, result.errors
    return tomllib.loads(result.dropin_text)


def site(schema: int, body: str) -> dict[str, str]:
    return {MAIN: f"version = {schema}\n{IMPORTS}", SITE: f"version = {schema}\n{body}"}


@pytest.mark.parametrize(("version", "schema", "plugin"), CASES)
def test_nri_mode_turns_on_nri_and_cdi_and_registers_no_runtime(version: Any, schema: int, plugin: str) -> None:
    result = plan(MAIN, {MAIN: f"version = {schema}\n"}, version, NRI_MODE)
    data = written(result)
    assert data["plugins"][NRI] == {"disable": False}
    cri = data["plugins"][plugin]
    assert cri["enable_cdi"] is True
    assert "nvidia" not in cri.get("containerd", {}).get("runtimes", {})
    assert "runtimes.nvidia" not in result.dropin_text
    assert result.mode_line == MODE_LINE
    assert f"#   {MODE_LINE}" in result.dropin_text
    assert "#   NRI on: disable = false (no file sets it)" in result.dropin_text
    assert result.dropin_text.startswith("# Managed by pyinfra-gpunode: NRI and CDI for the GPU Operator's NRI plugin")
    assert result.nri_expected is True
    if version["major"] == 1:  # this file owns the whole CRI plugin there: runc stays
        assert set(cri["containerd"]["runtimes"]) == {"runc"}
    else:  # only the keys NRI mode needs
        assert set(cri) == {"enable_cdi", "cdi_spec_dirs"}


def test_runtime_mode_writes_no_nri_and_names_no_mode() -> None:
    result = plan(MAIN, {MAIN: "version = 2\n"}, V17, Options())
    assert NRI not in written(result)["plugins"]
    assert result.mode_line == "" and result.nri_expected is None
    assert result.dropin_text.startswith(
        "# Managed by pyinfra-gpunode: the nvidia runtime for containerd's CRI plugin."
    )


def test_nri_mode_needs_containerd_17() -> None:
    result = plan(MAIN, {MAIN: "version = 2\n"}, V16, NRI_MODE)
    assert result.errors == [
        "containerd 1.6.20~ds1 has no NRI plugin (it came with containerd 1.7): "
        "gpunode_containerd_mode: nri needs containerd 1.7 or later"
    ]
    assert not result.dropin_text


def test_nri_mode_with_nvidia_as_default_is_refused() -> None:
    result = plan(MAIN, {MAIN: "version = 2\n"}, V17, Options(mode="nri", default_runtime=True))
    assert result.errors == ["NRI mode registers no runtime, so nvidia cannot be made the default runtime"]


@pytest.mark.parametrize(("version", "schema", "plugin"), CASES)
def test_a_file_turning_nri_off_is_kept_unless_asked(version: Any, schema: int, plugin: str) -> None:
    texts = site(schema, f'[plugins."{NRI}"]\n  disable = true\n  socket_path = "/run/nri/site.sock"\n')
    kept = plan(MAIN, texts, version, NRI_MODE)
    data = written(kept)
    if version["major"] == 1:  # the last file naming the plugin owns it: ours carries the file's keys
        assert data["plugins"][NRI] == {"disable": True, "socket_path": "/run/nri/site.sock"}
        assert f"#   NRI keys of {SITE} carried here: disable, socket_path" in kept.dropin_text
    else:  # 2.x deep-merges: nothing to write
        assert NRI not in data["plugins"]
    assert f"NRI stays off: {SITE} sets disable = true; kept (gpunode_enable_nri: true turns it on)" in (
        kept.dropin_text
    )
    assert kept.mode_line.startswith("NRI mode: no nvidia runtime registered; NRI stays off, CDI enabled")
    assert kept.nri_expected is False
    assert kept.nri_user_set["disable"] == (SITE, True)  # the gate holds the candidate to it

    asked = plan(MAIN, texts, version, Options(mode="nri", enable_nri=True))
    table = written(asked)["plugins"][NRI]
    assert table["disable"] is False
    assert table.get("socket_path", "/run/nri/site.sock") == "/run/nri/site.sock"
    assert f"NRI on: disable = false (gpunode_enable_nri); {SITE} sets true" in asked.dropin_text
    assert "disable" not in asked.nri_user_set and asked.nri_expected is True
    assert asked.mode_line == MODE_LINE


def test_a_file_turning_nri_on_is_kept_and_said() -> None:
    result = plan(MAIN, site(3, f'[plugins."{NRI}"]\n  disable = false\n'), V21, NRI_MODE)
    assert NRI not in written(result)["plugins"]
    assert f"NRI stays on: {SITE} sets disable = false; kept" in result.dropin_text
    assert result.mode_line == MODE_LINE


def test_on_17_every_files_nri_keys_are_carried() -> None:
    """1.7 keeps only the last file's table for a plugin: ours, loaded last, carries them all."""
    texts = site(2, f'[plugins."{NRI}"]\n  socket_path = "/run/nri/site.sock"\n')
    texts[f"{CONFD}/60-more.toml"] = f'version = 2\n[plugins."{NRI}"]\n  plugin_path = "/opt/site/nri"\n'
    result = plan(MAIN, texts, V17, NRI_MODE)
    assert written(result)["plugins"][NRI] == {
        "disable": False,
        "plugin_path": "/opt/site/nri",
        "socket_path": "/run/nri/site.sock",
    }
    assert {SITE, f"{CONFD}/60-more.toml"} <= set(result.sources)  # our file as strict as theirs


@pytest.mark.parametrize("name", [NRI, "nri"])
def test_disabled_plugins_naming_nri_is_kept_and_cannot_be_undone(name: str) -> None:
    texts = {MAIN: f'version = 2\ndisabled_plugins = ["{name}"]\n'}
    kept = plan(MAIN, texts, V17, NRI_MODE)
    assert f"NRI stays off: {MAIN} names {name} in disabled_plugins; kept" in kept.dropin_text
    assert kept.nri_expected is False
    asked = plan(MAIN, texts, V17, Options(mode="nri", enable_nri=True))
    assert asked.errors == [
        f"{MAIN}: disabled_plugins names {name}, so NRI stays off whatever a drop-in says; remove it there "
        "(gpunode_enable_nri asks for NRI)"
    ]


def test_cdi_a_file_turns_off_stays_off_and_the_mode_says_so() -> None:
    result = plan(MAIN, site(3, f'[plugins."{V3}"]\n  enable_cdi = false\n'), V21, NRI_MODE)
    assert "enable_cdi" not in written(result)["plugins"][V3]
    assert result.mode_line == (
        "NRI mode: no nvidia runtime registered; NRI enabled, CDI stays off as the files set it, "
        "for the GPU Operator's NRI plugin"
    )


def test_nvidia_runtime_a_file_defines_stays_in_nri_mode() -> None:
    """Only what our own file registered goes: a user's nvidia runtime is theirs."""
    body = f'[plugins."{V2}".containerd.runtimes.nvidia.options]\n  BinaryName = "{BINARY}"\n'
    texts = site(2, body)
    for version in (V17, V21):
        result = plan(MAIN, texts, version, NRI_MODE)
        assert not result.errors and not result.dropped
        if version["major"] == 1:  # carried as the file says it
            assert written(result)["plugins"][V2]["containerd"]["runtimes"]["nvidia"] == {
                "options": {"BinaryName": BINARY}
            }


# Switching modes.


@pytest.mark.parametrize(("version", "schema", "plugin"), CASES)
def test_switch_to_nri_mode_drops_our_runtime_and_says_so(version: Any, schema: int, plugin: str) -> None:
    texts = {MAIN: f"version = {schema}\n"}
    before = plan(MAIN, texts, version, Options(default_runtime=True))
    texts = {MAIN: before.config_text, OUR_DROPIN: before.dropin_text}
    result = plan(MAIN, texts, version, NRI_MODE)
    assert not result.errors
    assert result.dropped_lines[-1] == (
        f'dropped runtime nvidia and default_runtime_name = "nvidia" registered by {OUR_DROPIN}: '
        "NRI mode registers no runtime"
    )
    assert "containerd.runtimes.nvidia.options.BinaryName" in result.dropped
    assert result.dropped["containerd.default_runtime_name"] == OUR_DROPIN

    # The gate lets what the user's switch dropped go, and asks for nothing of the runtime.
    dumped = (3, V3) if version["major"] == 2 else (2, V2)  # a 2.x dump always says version 3
    old, new = (
        dump_of(dumped, runtimes, default)
        for runtimes, default in ((("nvidia", "runc"), "nvidia"), (("runc",), "runc"))
    )
    args = (old, new, [], [], result.intended, BINARY, result.user_set, result.dropped)
    assert candidate_losses(*args, runtime_expected=False) == []
    assert "runtime nvidia is missing from the merged config" in candidate_losses(*args)
    unaccounted = candidate_losses(*args[:7], runtime_expected=False)  # without what the switch dropped
    assert "runtime nvidia would be lost" in unaccounted
    assert f"{dumped[1]}:containerd.default_runtime_name would change from 'nvidia' to 'runc'" in unaccounted


def dump_of(dumped: tuple[int, str], runtimes: tuple[str, ...], default: str) -> dict[str, Any]:
    entries = {name: {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": BINARY}} for name in runtimes}
    table = {"enable_cdi": True, "containerd": {"default_runtime_name": default, "runtimes": entries}}
    return {"version": dumped[0], "plugins": {dumped[1]: table}}


def test_switch_back_to_runtime_mode_says_the_nri_settings_go() -> None:
    first = plan(MAIN, {MAIN: "version = 2\n"}, V17, NRI_MODE)
    result = plan(MAIN, {MAIN: first.config_text, OUR_DROPIN: first.dropin_text}, V17, Options())
    assert NRI not in written(result)["plugins"]
    assert result.dropped_lines == [
        f"dropped the NRI plugin settings of {OUR_DROPIN} (gpunode_containerd_mode: runtime): NRI is as the other "
        "files set it (off by default on containerd 1.7)"
    ]


def test_nri_mode_rerun_plans_the_same_file() -> None:
    texts = {MAIN: "version = 2\n"}
    first = plan(MAIN, texts, V17, NRI_MODE)
    again = plan(MAIN, {MAIN: first.config_text, OUR_DROPIN: first.dropin_text}, V17, NRI_MODE)
    assert (again.config_text, again.dropin_text) == (first.config_text, first.dropin_text)
    assert again.dropped_lines == [] and again.dropped == {}


# What a dump says of NRI, the gate and the restart check.


def nri_dump(disable: bool | None, listed: tuple[str, ...] = (), **keys: Any) -> dict[str, Any]:
    plugins = {} if disable is None else {NRI: {"disable": disable, "socket_path": "/var/run/nri/nri.sock", **keys}}
    return {"version": 2, "disabled_plugins": list(listed), "plugins": plugins}


def test_nri_state_reads_the_plugin_and_disabled_plugins() -> None:
    assert nri_state(nri_dump(False)) == (True, "")
    assert nri_state(nri_dump(True)) == (False, f"plugins.{NRI}.disable = true")
    assert nri_state(nri_dump(False, ("nri",))) == (False, "disabled_plugins names nri")
    assert nri_state(nri_dump(None))[0] is None


def test_nri_gate_holds_nri_on_and_the_files_keys() -> None:
    assert nri_losses(nri_dump(True), None, {}) == []  # runtime mode: not asked
    assert nri_losses(nri_dump(True), True, {}) == [
        f"NRI would stay off in the merged config: plugins.{NRI}.disable = true"
    ]
    kept = {
        "disable": (SITE, True),
        "socket_path": (SITE, "/run/nri/site.sock"),
        "plugin_request_timeout": (SITE, "2000ms"),
    }
    assert nri_losses(nri_dump(True, socket_path="/run/nri/site.sock", plugin_request_timeout="2s"), False, kept) == []
    assert nri_losses(nri_dump(False, plugin_request_timeout="2s"), False, kept) == [
        f"{NRI}:disable is set to True in {SITE}; the candidate makes it False",
        f"{NRI}:socket_path is set to '/run/nri/site.sock' in {SITE}; the candidate makes it '/var/run/nri/nri.sock'",
    ]


def test_restart_check_asks_for_no_nvidia_runtime_in_nri_mode() -> None:
    summary = summarize({"version": 2, "plugins": {V2: {"containerd": {"runtimes": {"runc": {}}}}}})
    previous = parse_cri_start_log([])
    assert expected_after_restart(summary, previous, runtime_expected=False)["runtimes"] == ["runc"]
    assert expected_after_restart(summary, previous)["runtimes"] == ["nvidia", "runc"]


# Host data.


def test_mode_is_validated_naming_the_key() -> None:
    assert validate({})["gpunode_containerd_mode"] == "runtime"
    assert validate({"gpunode_containerd_mode": "nri"})["gpunode_enable_nri"] is None
    with pytest.raises(HostDataError, match="host-data key 'gpunode_containerd_mode' must be one of: runtime, nri"):
        validate({"gpunode_containerd_mode": "cdi"})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"gpunode_containerd_mode": "nri", "gpunode_nvidia_default_runtime": True},
            "host-data key 'gpunode_nvidia_default_runtime' must be false with gpunode_containerd_mode: nri",
        ),
        ({"gpunode_enable_nri": True}, "host-data key 'gpunode_enable_nri' applies only with gpunode_containerd_mode"),
        (
            {"gpunode_containerd_mode": "nri", "gpunode_enable_nri": False},
            "host-data key 'gpunode_enable_nri' must be true or null, got False",
        ),
    ],
)
def test_keys_contradicting_the_mode_are_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(HostDataError, match=message):
        validate(data)


# The readiness report.


def nri_node(disable: bool = False, enable_cdi: bool = True) -> dict[str, Any]:
    """The healthy node in NRI mode: no nvidia runtime in the files or the daemon, NRI as given."""
    facts = healthy()
    state = facts["containerd"]
    del state["dump"]["summary"]["runtimes"]["nvidia"]
    state["dump"]["summary"]["enable_cdi"] = enable_cdi
    state["dump"]["dump"] = copied(state["dump"]["dump"])  # the parsed dump is shared, read-only
    state["dump"]["dump"]["plugins"][NRI]["disable"] = disable
    facts["cri"]["runtimes"] = [name for name in facts["cri"]["runtimes"] if name != "nvidia"]
    facts["toolkit"]["runtime_binary"] = None
    state["binary_present"] = False
    return facts


def links(facts: dict[str, Any], mode: str) -> dict[str, Any]:
    return {link.id: link for link in assess("gpu1", facts, BINARY, SPEC, "nvidia", mode).links}


def test_readiness_in_nri_mode_asks_for_nri_and_cdi_not_the_runtime() -> None:
    found = links(nri_node(), "nri")
    assert found["containerd_config"].state == OK
    assert "NRI on, enable_cdi true" in found["containerd_config"].detail
    assert found["containerd_running"].state == OK
    assert found["runtime_handler"].state == NOT_APPLICABLE
    assert found["toolkit"].state == OK
    assert assess("gpu1", nri_node(), BINARY, SPEC, mode="nri").ready

    runtime_mode = links(nri_node(), "runtime")  # the same node in runtime mode lacks its runtime
    assert runtime_mode["containerd_config"].state == BROKEN
    assert runtime_mode["runtime_handler"].state == BROKEN


def test_readiness_in_nri_mode_names_nri_or_cdi_off() -> None:
    off = links(nri_node(disable=True), "nri")["containerd_config"]
    assert off.state == BROKEN
    assert off.cause and f"has NRI off (plugins.{NRI}.disable = true)" in off.cause
    assert off.fix and "gpunode_enable_nri: true" in off.fix
    cdi = links(nri_node(enable_cdi=False), "nri")["containerd_config"]
    assert cdi.state == BROKEN
    assert cdi.cause and "enable_cdi = false" in cdi.cause
    assert cdi.fix and "gpunode_enable_cdi: true" in cdi.fix
