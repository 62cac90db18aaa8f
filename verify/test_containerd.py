"""containerd on a ready GPU node: running, with the nvidia runtime in its config and in the daemon."""

from __future__ import annotations

import tomllib

from pyinfra_gpunode.containerd_dropin import CRI_V2
from pyinfra_gpunode.containerd_dump import CRI_V3_IMAGES, expected_after_restart, nri_state, restart_problem
from pyinfra_gpunode.facts.containerd import (
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdService,
    cri_address,
)
from pyinfra_gpunode.hostdata import settings as settings_of

from .facts import read_fact
from .inventory import Node


def _merged(node: Node) -> dict:
    """``containerd config dump`` of the config file the service starts containerd with."""
    main_path = read_fact(node, ContainerdConfigFiles)["main_path"]
    dump = read_fact(node, ContainerdConfigDump, config_path=main_path)
    assert dump is not None, "containerd is not installed"
    assert dump["error"] is None, f"containerd cannot load its config: {dump['error']}"
    return dump


def test_containerd_active_and_enabled(node: Node) -> None:
    service = node.host.service("containerd")
    assert service.is_running
    assert service.is_enabled


def test_nvidia_runtime_in_merged_config(node: Node) -> None:
    """The nvidia runtime as host data asks; in NRI mode NRI and CDI on instead (no runtime asked for)."""
    merged = _merged(node)
    summary = merged["summary"]
    settings = settings_of(node.data)
    if settings.containerd.mode == "nri":
        on, why = nri_state(merged["dump"])
        assert on, f"NRI mode: NRI is not on in `containerd config dump`: {why}"
        assert summary["enable_cdi"] is True, f"NRI mode: enable_cdi is {summary['enable_cdi']!r} in the merged config"
        return
    nvidia = summary["runtimes"].get("nvidia")
    assert nvidia is not None, f"no nvidia runtime in `containerd config dump` (runtimes: {list(summary['runtimes'])})"
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["BinaryName"] == settings.runtime.binary
    if settings.runtime.systemd_cgroup is not None:
        assert nvidia["SystemdCgroup"] == settings.runtime.systemd_cgroup


def test_default_runtime_is_defined(node: Node) -> None:
    summary = _merged(node)["summary"]
    assert summary["default_runtime_present"], (
        f"default runtime {summary['default_runtime_name']!r} is not among {list(summary['runtimes'])}"
    )
    if settings_of(node.data).runtime.default_runtime:
        assert summary["default_runtime_name"] == "nvidia"


def test_running_daemon_loaded_nvidia_runtime(node: Node) -> None:
    """The running daemon judged as the rollout judges the daemon it restarted: active, its CRI plugin
    loaded with the nvidia runtime, every runtime of the config and its default runtime. Where
    containerd logs no CRI start line (a log level above info) only the plugin's status is known,
    from ``ctr plugins ls``, and an ``ok`` there is what the rollout accepts too."""
    dump = _merged(node)
    address = cri_address(dump)
    service = read_fact(node, ContainerdService)
    loaded = read_fact(node, ContainerdCriLoaded, address=address) or ContainerdCriLoaded.default()
    assert service is not None, "systemd does not answer"
    nri = settings_of(node.data).containerd.mode == "nri"  # NRI mode: no nvidia runtime asked for
    expected = expected_after_restart(dump["summary"], loaded, runtime_expected=not nri)
    problem = restart_problem(service["active_state"], service["result"], loaded, expected)
    assert problem is None, f"the running containerd: {problem} (read from {loaded['source'] or 'nothing'})"


def test_registry_config_path_kept(node: Node) -> None:
    """The registry ``config_path`` set in the main config survives the drop-ins merged over it."""
    files = read_fact(node, ContainerdConfigFiles)
    main = files["main"]
    assert main is not None and main["error"] is None, f"main config unreadable: {files['main_path']}"
    plugins = tomllib.loads(main["text"]).get("plugins", {})
    images = plugins.get(CRI_V3_IMAGES if main["version"] == 3 else CRI_V2, {})
    expected = images.get("registry", {}).get("config_path")
    merged = _merged(node)["summary"]["registry_config_path"]
    if expected is not None:
        assert merged == expected, f"registry config_path {expected!r} in {main['path']} became {merged!r}"
