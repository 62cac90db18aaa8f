"""k3s and RKE2: which host data goes into gpunode's drop-in in the agent's config-v3.toml.d, and where none."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pyinfra_gpunode import rancher
from pyinfra_gpunode.platform import ContainerdPlatformInfo, runtime_requests
from pyinfra_gpunode.versions import ContainerdVersionInfo

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
V3 = (SAMPLES / "rke2-containerd-config-v3.toml").read_text().split("\n", 1)[1]
V2 = (SAMPLES / "k3s-containerd-config.toml").read_text().split("\n", 1)[1]
TOOLKIT = "/usr/bin/nvidia-container-runtime"
# The agent adds nvidia as k3s-io/k3s pkg/agent/containerd/runtimes.go renders it in the version-3 template.
NVIDIA = f"""
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia']
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia'.options]
  BinaryName = "{TOOLKIT}"
  SystemdCgroup = true
"""
RUNTIME = "io.containerd.cri.v1.runtime"


def version(raw: str) -> ContainerdVersionInfo:
    major, minor, patch = (int(part) for part in raw.split("."))
    return {"major": major, "minor": minor, "patch": patch, "raw": raw, "build": ""}


def rke2(*runtimes: str) -> ContainerdPlatformInfo:
    return {
        "name": "rke2", "evidence": [], "k0s_managed": None, "unit": "rke2-agent.service", "toolkit": TOOLKIT,
        "runtimes": list(runtimes or ("runc", "nvidia")),
    }  # fmt: skip


def test_the_drop_in_holds_only_the_keys_asked() -> None:
    asked = runtime_requests(default_runtime=True, enable_cdi=False)
    table = rancher.dropin_table(asked, rke2(), V3 + NVIDIA)
    assert table == {
        "version": 3,
        "plugins": {RUNTIME: {"containerd": {"default_runtime_name": "nvidia"}, "enable_cdi": False}},
    }
    text = rancher.render(table, rke2())
    assert tomllib.loads(text) == table
    assert text.startswith("# Written by pyinfra-gpunode: what host data asks beyond the nvidia runtime RKE2 adds")
    assert rancher.intended(table) == {"containerd.default_runtime_name": "nvidia", "enable_cdi": False}
    # Nothing asked: no drop-in at all.
    assert rancher.dropin_table(runtime_requests(), rke2(), V3 + NVIDIA) == {}


def test_cdi_cgroup_nri_and_another_handler_go_in_the_drop_in() -> None:
    asked = runtime_requests(
        systemd_cgroup=False, cdi_spec_dirs=["/etc/cdi"], mode="nri", enable_nri=True, handler="nvidia-gpu"
    )
    table = rancher.dropin_table(asked, rke2(), V3 + NVIDIA)
    runtime = table["plugins"][RUNTIME]
    assert runtime["enable_cdi"] is True  # NRI mode turns CDI on unless host data says otherwise
    assert runtime["cdi_spec_dirs"] == ["/etc/cdi"]
    assert runtime["containerd"]["runtimes"] == {
        "nvidia": {"options": {"SystemdCgroup": False}},
        "nvidia-gpu": {
            "runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": TOOLKIT, "SystemdCgroup": False},
        },
    }
    assert table["plugins"]["io.containerd.nri.v1.nri"] == {"disable": False}
    # A handler the agent defines itself is no request.
    assert "runtimes" not in rancher.dropin_table({"gpunode_runtime_handler": "nvidia-cdi"}, rke2("nvidia-cdi"), V3)


def test_a_rerun_renders_the_same_bytes() -> None:
    asked = runtime_requests(default_runtime=True, cdi_spec_dirs=["/var/run/cdi", "/etc/cdi"])
    first = rancher.render(rancher.dropin_table(asked, rke2(), V3 + NVIDIA), rke2())
    again = rancher.render(rancher.dropin_table(dict(reversed(asked.items())), rke2(), V3 + NVIDIA), rke2())
    assert first == again


def test_only_a_version_3_config_importing_the_directory_on_containerd_2_takes_a_drop_in() -> None:
    assert rancher.layout_problem(version("2.1.9"), V3, "rke2") is None
    assert rancher.dropin_path("rke2") == (
        "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d/90-gpunode-nvidia.toml"
    )
    # k3s on containerd 1.7 with the version-2 template: 1.7 replaces the whole CRI section with the last file's.
    assert "replaces the whole CRI section" in (rancher.layout_problem(version("1.7.24"), V2, "k3s") or "")
    assert rancher.layout_problem(version("2.1.9"), V2, "k3s") == (
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml is not version 3 importing "
        "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/*.toml"
    )
    no_imports = V3.replace('imports = ["/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d/*.toml"]\n', "")
    assert rancher.layout_problem(version("2.1.9"), no_imports, "rke2")
    assert rancher.layout_problem(version("2.1.9"), None, "rke2")
    assert rancher.layout_problem(None, V3, "rke2")


def test_a_binary_other_than_the_agents_takes_no_drop_in() -> None:
    assert rancher.appliable(runtime_requests(default_runtime=True, binary=TOOLKIT), rke2())
    assert not rancher.appliable(runtime_requests(binary="/opt/nvidia/nvidia-container-runtime"), rke2())


def test_the_merged_config_must_show_each_key_of_the_drop_in() -> None:
    table = rancher.dropin_table(runtime_requests(default_runtime=True, mode="nri"), rke2(), V3)
    shown = {
        "plugins": {
            RUNTIME: {"enable_cdi": True, "containerd": {"default_runtime_name": "nvidia"}},
            "io.containerd.nri.v1.nri": {"disable": False},
        }
    }
    assert rancher.unshown(shown, table, "X") == []
    shown["plugins"][RUNTIME]["containerd"] = {"default_runtime_name": "runc"}
    assert rancher.unshown(shown, table, "X") == [
        "io.containerd.cri.v1.runtime.containerd.default_runtime_name = 'nvidia' from X (the merged config has 'runc')"
    ]


def test_keys_host_data_no_longer_asks_for_are_dropped_and_the_drop_in_emptied() -> None:
    path = "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d/90-gpunode-nvidia.toml"
    written = {"version": 3, "plugins": {RUNTIME: {"containerd": {"default_runtime_name": "nvidia"},
                                                          "enable_cdi": False}}}  # fmt: skip
    still = {"version": 3, "plugins": {RUNTIME: {"enable_cdi": False}}}
    assert rancher.dropped_keys(written, still, path) == {"containerd.default_runtime_name": path}
    assert rancher.dropped_keys(written, {}, path) == {
        "containerd.default_runtime_name": path, "enable_cdi": path,
    }  # fmt: skip
    assert rancher.dropped_keys({}, still, path) == {}
    assert rancher.written_table("not toml [") == {} and rancher.written_table(None) == {}
    assert rancher.written_table(rancher.render(written, rke2())) == written
    assert rancher.write_line(rke2(), {}).startswith(
        f"empty {path} (host data asks nothing beyond RKE2's own runtime now), then restart rke2-agent.service"
    )
    assert rancher.applied_note(rke2(), {}).endswith(f"{path} sets nothing")


def test_a_handler_named_with_a_dot_is_one_key_of_the_merged_config() -> None:
    """``nvidia.cdi`` is a runtime name the host data takes: it was split at its dot and looked up as two
    tables, and the drop-in refused as not shown though containerd merged it."""
    table = {"version": 3, "plugins": {RUNTIME: {"containerd": {"runtimes": {"nvidia.cdi": {"runtime_type": "x"}}}}}}
    shown = {"plugins": {RUNTIME: {"containerd": {"runtimes": {"nvidia.cdi": {"runtime_type": "x"}}}}}}
    assert rancher.unshown(shown, table, "X") == []
    shown["plugins"][RUNTIME]["containerd"]["runtimes"]["nvidia.cdi"]["runtime_type"] = "y"
    assert rancher.unshown(shown, table, "X") == [
        "io.containerd.cri.v1.runtime.containerd.runtimes.\"nvidia.cdi\".runtime_type = 'x' from X "
        "(the merged config has 'y')"
    ]
