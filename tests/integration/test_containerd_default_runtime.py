"""Real containerd 1.7.24 and 2.1.9 judge the nvidia runtime built from the default runtime and the
values the files set for the keys we write (``containerd config dump`` of the staged and written files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import Options
from pyinfra_gpunode.facts.containerd import ContainerdConfigDump
from tests.integration.test_containerd_matrix import apply_plan, build, candidate, cri_table, losses
from tests.realbin.scenarios import CONFIG, V2, V3

pytestmark = pytest.mark.containerd
BINARY = "/usr/bin/nvidia-container-runtime"


def gpu_image(plugin: str) -> str:
    """A managed GPU node's config.toml: ``version = 2`` (with version-3 plugin names on 2.x), the default
    runtime an nvidia runtime named ``nvidia-container-runtime`` with its own settings, no runc."""
    return f"""version = 2
oom_score = -999

[plugins.{plugin}.containerd]
  default_runtime_name = "nvidia-container-runtime"

[plugins.{plugin}.containerd.runtimes.nvidia-container-runtime]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "/etc/containerd/cri-base.json"
  privileged_without_host_devices = true

[plugins.{plugin}.containerd.runtimes.nvidia-container-runtime.options]
  BinaryName = "{BINARY}"
  SystemdCgroup = true
  Root = "/run/nvidia-runc"
"""


def runtimes_of(dump: dict, version: str) -> dict:
    return cri_table(dump, version)["containerd"]["runtimes"]


@pytest.mark.parametrize(("version", "plugin"), [("1.7.24", V2), ("2.1.9", V3)])
def test_nvidia_copies_the_default_runtime(tmp_path: Path, version: str, plugin: str) -> None:
    host = build(tmp_path, version, {CONFIG: gpu_image(plugin)})
    before = host.fact(ContainerdConfigDump)
    assert before["summary"]["default_runtime_name"] == "nvidia-container-runtime"
    _files, result = apply_plan(host)
    assert result.dropin_data["version"] == 2
    staged = candidate(host, result)
    assert staged["error"] is None, staged["error"]
    assert losses(before, staged, result) == []

    host.write(CONFIG, result.config_text)
    host.write(result.dropin_path, result.dropin_text)
    after = host.fact(ContainerdConfigDump)
    assert after["error"] is None and after["warnings"] == []
    runtimes = runtimes_of(after["dump"], version)
    nvidia, theirs = runtimes["nvidia"], runtimes["nvidia-container-runtime"]
    assert nvidia["options"]["BinaryName"] == BINARY
    assert nvidia["options"]["SystemdCgroup"] is True
    assert nvidia["options"]["Root"] == "/run/nvidia-runc"
    assert nvidia["base_runtime_spec"] == "/etc/containerd/cri-base.json"
    assert nvidia["privileged_without_host_devices"] is True
    assert theirs["options"]["BinaryName"] == BINARY  # kept as it is
    assert after["summary"]["default_runtime_name"] == "nvidia-container-runtime"
    if version == "1.7.24":
        assert "runc" not in runtimes  # neither defined nor needed: the default runtime is another
    assert "copied from runtime nvidia-container-runtime (the default runtime" in result.dropin_text


def cdi_off(version: str) -> str:
    plugin = V2 if version == "1.7.24" else V3
    return f"version = {2 if version == '1.7.24' else 3}\n\n[plugins.{plugin}]\n  enable_cdi = false\n"


@pytest.mark.parametrize("version", ["1.7.24", "2.1.9"])
def test_enable_cdi_a_file_turns_off_stays_off_unless_asked(tmp_path: Path, version: str) -> None:
    host = build(tmp_path, version, {CONFIG: cdi_off(version)})
    before = host.fact(ContainerdConfigDump)
    assert before["summary"]["enable_cdi"] is False
    _files, result = apply_plan(host)
    staged = candidate(host, result)
    assert staged["summary"]["enable_cdi"] is False
    assert losses(before, staged, result) == []
    assert f"CDI stays off: {CONFIG} sets enable_cdi = false; kept" in result.dropin_text

    # A candidate turning it on anyway is refused, naming the file.
    if version == "1.7.24":  # 1.x: our file carries the CRI section, the file's value in it
        on = result.dropin_text.replace("\nenable_cdi = false\n", "\nenable_cdi = true\n")
    else:  # 2.x: our file leaves the key to the file that sets it
        table = '[plugins."io.containerd.cri.v1.runtime"]\n'
        on = result.dropin_text.replace(table, table + "enable_cdi = true\n", 1)
    staged_on = candidate(host, result, dropin_text=on)
    assert staged_on["error"] is None and staged_on["summary"]["enable_cdi"] is True
    found = losses(before, staged_on, result)
    assert any(f"enable_cdi is set to False in {CONFIG}; the candidate makes it True" in loss for loss in found), found

    _files, asked = apply_plan(host, Options(enable_cdi=True))
    staged = candidate(host, asked)
    assert staged["summary"]["enable_cdi"] is True
    assert losses(before, staged, asked) == []
    assert f"enable_cdi = true (gpunode_enable_cdi); {CONFIG} sets false" in asked.dropin_text
