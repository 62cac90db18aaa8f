"""NRI mode against Debian's real containerd 1.6.20, 1.7.24 and 2.1.9: the planned files judged by the
binary's own ``config dump`` and, briefly, by the daemon itself (its NRI and CRI start lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, Options, plan
from pyinfra_gpunode.containerd_dump import candidate_losses, nri_losses, nri_state, parse_cri_start_log
from pyinfra_gpunode.facts.containerd import ContainerdConfigDump, ContainerdConfigFiles, ContainerdVersion
from tests.integration.test_containerd_matrix import BINARY, apply_plan, build, candidate, cri_table
from tests.realbin.scenarios import CONFIG, debian_config

pytestmark = pytest.mark.containerd
NRI_MODE = Options(mode="nri")
NRI_ON = "created NRI interface"
NRI_OFF = "NRI interface is disabled by configuration."


@pytest.mark.parametrize("version", ["1.7.24", "2.1.9"])
def test_nri_mode_on_debians_config_judged_by_the_dump(tmp_path: Path, version: str) -> None:
    host = build(tmp_path, version, {CONFIG: debian_config(version)})
    before = host.fact(ContainerdConfigDump)
    assert nri_state(before["dump"])[0] is (version == "2.1.9")  # off by default on 1.7, on from 2.0
    _files, result = apply_plan(host, NRI_MODE)
    after = candidate(host, result)
    assert after["error"] is None, after
    assert nri_state(after["dump"]) == (True, "")
    runtime = cri_table(after["dump"], version)
    assert runtime["enable_cdi"] is True
    assert set(runtime["containerd"]["runtimes"]) == {"runc"}
    gate = candidate_losses(
        before["dump"], after["dump"], before["warnings"], after["warnings"], result.intended, BINARY,
        result.user_set, result.dropped, runtime_expected=False,
    )  # fmt: skip
    assert gate + nri_losses(after["dump"], result.nri_expected, result.nri_user_set) == []


@pytest.mark.parametrize("version", ["1.7.24", "2.1.9"])
def test_a_gate_without_the_nri_check_would_pass_nri_off(tmp_path: Path, version: str) -> None:
    """The NRI check is what holds a candidate to NRI on: a drop-in leaving it off passes every CRI check."""
    host = build(tmp_path, version, {CONFIG: debian_config(version)})
    _files, result = apply_plan(host, NRI_MODE)
    off = result.dropin_text.replace("disable = false", "disable = true")
    after = candidate(host, result, dropin_text=off)
    assert after["error"] is None, after
    assert nri_state(after["dump"])[0] is False
    assert nri_losses(after["dump"], result.nri_expected, result.nri_user_set) == [
        "NRI would stay off in the merged config: plugins.io.containerd.nri.v1.nri.disable = true"
    ]


def test_nri_mode_on_16_is_refused_naming_17(tmp_path: Path) -> None:
    host = build(tmp_path, "1.6.20", {CONFIG: debian_config("1.6.20")})
    files = host.fact(ContainerdConfigFiles)
    result = plan(files["main_path"], files["texts"], host.fact(ContainerdVersion), NRI_MODE)
    assert len(result.errors) == 1 and "needs containerd 1.7 or later" in result.errors[0], result.errors


@pytest.mark.daemon
@pytest.mark.parametrize("version", ["1.7.24", "2.1.9"])
def test_daemon_starts_nri_and_cri_without_an_nvidia_runtime(tmp_path: Path, version: str) -> None:
    host = build(tmp_path, version, {CONFIG: debian_config(version)})
    if version == "1.7.24":  # NRI is off by default there: what NRI mode changes
        assert NRI_OFF in host.run_daemon()
    _files, result = apply_plan(host, NRI_MODE)
    host.write(CONFIG, result.config_text)
    host.write(OUR_DROPIN, result.dropin_text)
    log = host.run_daemon()
    assert NRI_ON in log and NRI_OFF not in log, log[-3000:]
    loaded = parse_cri_start_log(log.splitlines())
    assert loaded["loaded"], loaded
    assert loaded["runtimes"] == ["runc"]
    assert loaded["enable_cdi"] is True
