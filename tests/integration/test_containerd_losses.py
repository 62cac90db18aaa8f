"""Settings containerd drops without an error, named from the node's files and its own merged config.

Real binaries judge each tree by their ``config dump``: a version 2 config.toml with its own CRI settings
under a version 3 drop-in loses them on 2.1.9 (the merged tree takes the last file's version), is refused
by v2.3.4 (its dump fails) and is merged by 2.4 (each file migrated on its own); on 1.7.24 a registry
drop-in loaded after config.toml owns the whole CRI plugin and config.toml's CRI settings are gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_files import load_order, resolve_tree
from pyinfra_gpunode.containerd_losses import lost_settings
from pyinfra_gpunode.facts.containerd import ContainerdConfigDump, ContainerdConfigFiles
from tests.realbin.namespace import ScenarioHost
from tests.realbin.scenarios import CONFD, CONFIG, main_with_cri, registry

pytestmark = pytest.mark.containerd
V3_DROPIN = (
    'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
    '  runtime_type = "io.containerd.runc.v2"\n'
)


def lost(tmp_path: Path, version: str, files: dict[str, str]) -> tuple[dict, list[str]]:
    host = ScenarioHost(tmp_path, version)
    for path, text in files.items():
        host.write(path, text)
    dump = host.fact(ContainerdConfigDump)
    tree = load_order(resolve_tree(CONFIG, host.fact(ContainerdConfigFiles)["texts"]))
    return dump, ([] if dump["error"] else lost_settings(dump["dump"], tree))


@pytest.mark.parametrize("version", ["2.1.9", "2.3.4", "2.4.0-dev"])
def test_a_version_3_dropin_over_a_version_2_root(tmp_path: Path, version: str) -> None:
    dump, found = lost(tmp_path, version, {CONFIG: main_with_cri(2), f"{CONFD}/99-nvidia.toml": V3_DROPIN})
    if version == "2.3.4":  # the binary refuses the tree itself: its own error is the answer
        assert (
            dump["error"] is not None and "drop-in config version 3 higher than root config version 2" in dump["error"]
        )
        return
    assert dump["error"] is None, dump["error"]
    if version == "2.1.9":
        assert (
            f"registry.config_path = '/etc/containerd/certs.d-main' in {CONFIG}, but containerd's merged config has ''"
            in found
        )
        assert any(line.startswith("containerd.runtimes.runc.options.SystemdCgroup = True in") for line in found), found
    else:
        assert found == []


def test_a_registry_dropin_owning_the_cri_plugin_on_17(tmp_path: Path) -> None:
    _dump, found = lost(tmp_path, "1.7.24", {CONFIG: main_with_cri(2), f"{CONFD}/10-registry.toml": registry()})
    assert f"max_container_log_line_size = 12345 in {CONFIG}, but containerd's merged config has 16384" in found, found


@pytest.mark.parametrize("version", ["1.7.24", "2.1.9", "2.3.4", "2.4.0-dev"])
def test_a_tree_containerd_merges_as_written_loses_nothing(tmp_path: Path, version: str) -> None:
    schema = 3 if version.startswith("2.") else 2
    dump, found = lost(tmp_path, version, {CONFIG: main_with_cri(schema)})
    assert dump["error"] is None and found == []
