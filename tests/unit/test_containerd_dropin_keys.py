"""Pure logic of the drop-in planner: nvidia as a copy of the default runtime, the files' values of
every key we write kept unless host data names another, and the schema containerd applies."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from pyinfra_gpunode.containerd_dropin import Options, Plan, plan
from pyinfra_gpunode.containerd_dump import candidate_losses, summarize
from pyinfra_gpunode.versions import parse_containerd_version

MAIN = "/etc/containerd/config.toml"
CONFD = "/etc/containerd/conf.d"
IMPORTS = f'imports = ["{CONFD}/*.toml"]\n'
V2 = '"io.containerd.grpc.v1.cri"'
V3 = '"io.containerd.cri.v1.runtime"'
V17 = parse_containerd_version("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1")
V21 = parse_containerd_version("containerd github.com/containerd/containerd/v2 2.1.9+unknown ")
V23 = parse_containerd_version("containerd github.com/containerd/containerd/v2 v2.3.1 0aa3d9ae")
BINARY = "/usr/bin/nvidia-container-runtime"


def gpu_image(schema: int, plugin: str) -> str:
    """A managed GPU node's config.toml: the default runtime is an nvidia runtime under another
    name (``nvidia-container-runtime``), with its own settings, and no runc."""
    return f"""version = {schema}
oom_score = -999

[plugins.{plugin}.containerd]
  default_runtime_name = "nvidia-container-runtime"

[plugins.{plugin}.containerd.runtimes.nvidia-container-runtime]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "/etc/containerd/cri-base.json"
  privileged_without_host_devices = true
  {"sandboxer" if plugin == V3 and schema >= 3 else "sandbox_mode"} = "podsandbox"

[plugins.{plugin}.containerd.runtimes.nvidia-container-runtime.options]
  BinaryName = "{BINARY}"
  SystemdCgroup = true
  Root = "/run/nvidia-runc"
"""


def dropin(result: Plan) -> dict[str, Any]:
    assert not result.errors, result.errors
    return tomllib.loads(result.dropin_text)


def runtime_table(data: dict[str, Any], plugin: str) -> dict[str, Any]:
    return data["plugins"][plugin.strip('"')]


CASES = [(V17, 2, V2), (V21, 2, V3), (V21, 3, V3), (V23, 4, V3)]


@pytest.mark.parametrize(("version", "schema", "plugin"), CASES)
def test_nvidia_is_a_copy_of_the_default_runtime(version: Any, schema: int, plugin: str) -> None:
    result = plan(
        MAIN, {MAIN: gpu_image(schema, plugin)}, version, Options(), {"runtime_type": "io.containerd.runc.v2"}
    )
    data = dropin(result)
    assert data["version"] == schema
    nvidia = runtime_table(data, plugin)["containerd"]["runtimes"]["nvidia"]
    sandbox = "sandboxer" if plugin == V3 and schema >= 3 else "sandbox_mode"
    assert nvidia == {
        "runtime_type": "io.containerd.runc.v2",
        "base_runtime_spec": "/etc/containerd/cri-base.json",
        "privileged_without_host_devices": True,
        sandbox: "podsandbox",
        "options": {"BinaryName": BINARY, "SystemdCgroup": True, "Root": "/run/nvidia-runc"},
    }
    assert "runtime nvidia: copied from runtime nvidia-container-runtime (the default runtime, as " in (
        result.dropin_text
    )
    assert "runtime nvidia-container-runtime already runs /usr/bin/nvidia-container-runtime: kept" in (
        result.dropin_text
    )


def test_runc_is_added_only_where_the_merged_config_has_or_needs_it() -> None:
    image = gpu_image(2, V2)
    runtimes = runtime_table(dropin(plan(MAIN, {MAIN: image}, V17, Options())), V2)["containerd"]["runtimes"]
    assert sorted(runtimes) == ["nvidia", "nvidia-container-runtime"]  # the default is another name: no runc
    loaded = {"runtime_type": "io.containerd.runc.v2"}  # runc in the node's dump now (a later file shadows ours)
    runtimes = runtime_table(dropin(plan(MAIN, {MAIN: image}, V17, Options(), loaded)), V2)["containerd"]["runtimes"]
    assert "runc" in runtimes
    plain = dropin(plan(MAIN, {MAIN: "version = 2\n"}, V17, Options()))
    assert "runc" in runtime_table(plain, V2)["containerd"]["runtimes"]  # default runc, no file defines it


def test_default_runtime_of_another_shim_gives_runc_settings() -> None:
    kata = f"""version = 2
[plugins.{V2}.containerd]
  default_runtime_name = "kata"
[plugins.{V2}.containerd.runtimes.kata]
  runtime_type = "io.containerd.kata.v2"
[plugins.{V2}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.{V2}.containerd.runtimes.runc.options]
  SystemdCgroup = true
"""
    result = plan(MAIN, {MAIN: kata}, V17, Options())
    nvidia = runtime_table(dropin(result), V2)["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2" and nvidia["options"]["SystemdCgroup"] is True
    assert "copied from runtime runc: the default runtime kata uses the shim 'io.containerd.kata.v2'" in (
        result.dropin_text
    )


# Each key the project writes, against a file that sets another value.


def cri_file(schema: int, plugin: str, body: str) -> dict[str, str]:
    return {MAIN: f"version = {schema}\n{IMPORTS}", f"{CONFD}/10-site.toml": f"version = {schema}\n{body}"}


@pytest.mark.parametrize(("version", "schema", "plugin"), [(V17, 2, V2), (V21, 3, V3), (V21, 2, V2)])
def test_enable_cdi_a_file_turns_off_stays_off(version: Any, schema: int, plugin: str) -> None:
    texts = cri_file(schema, plugin, f"[plugins.{plugin}]\n  enable_cdi = false\n")
    kept = plan(MAIN, texts, version, Options())
    assert runtime_table(dropin(kept), plugin).get("enable_cdi", False) is False
    assert f"CDI stays off: {CONFD}/10-site.toml sets enable_cdi = false; kept" in kept.dropin_text
    assert kept.user_set["enable_cdi"] == (f"{CONFD}/10-site.toml", False)  # the gate holds the candidate to it

    asked = plan(MAIN, texts, version, Options(enable_cdi=True))
    assert runtime_table(dropin(asked), plugin)["enable_cdi"] is True
    assert f"enable_cdi = true (gpunode_enable_cdi); {CONFD}/10-site.toml sets false" in asked.dropin_text
    assert "enable_cdi" not in asked.user_set


@pytest.mark.parametrize(("version", "schema", "plugin"), [(V17, 2, V2), (V21, 3, V3)])
def test_cdi_spec_dirs_a_file_sets_are_kept(version: Any, schema: int, plugin: str) -> None:
    texts = cri_file(schema, plugin, f'[plugins.{plugin}]\n  cdi_spec_dirs = ["/opt/cdi"]\n')
    kept = plan(MAIN, texts, version, Options())
    assert runtime_table(dropin(kept), plugin).get("cdi_spec_dirs", ["/opt/cdi"]) == ["/opt/cdi"]
    assert f'{CONFD}/10-site.toml sets cdi_spec_dirs = ["/opt/cdi"]; kept' in kept.dropin_text
    assert "cdi_spec_dirs" in kept.user_set

    asked = plan(MAIN, texts, version, Options(cdi_spec_dirs=("/etc/cdi",)))
    assert runtime_table(dropin(asked), plugin)["cdi_spec_dirs"] == ["/etc/cdi"]
    assert f'cdi_spec_dirs = ["/etc/cdi"] (gpunode_cdi_spec_dirs); {CONFD}/10-site.toml sets ["/opt/cdi"]' in (
        asked.dropin_text
    )


@pytest.mark.parametrize(("version", "schema", "plugin"), [(V17, 2, V2), (V21, 3, V3)])
def test_default_runtime_name_changes_only_when_asked_and_names_the_file(
    version: Any, schema: int, plugin: str
) -> None:
    texts = cri_file(schema, plugin, f'[plugins.{plugin}.containerd]\n  default_runtime_name = "runc"\n')
    kept = runtime_table(dropin(plan(MAIN, texts, version, Options())), plugin)["containerd"]
    assert kept.get("default_runtime_name", "runc") == "runc"
    asked = plan(MAIN, texts, version, Options(default_runtime=True))
    assert runtime_table(dropin(asked), plugin)["containerd"]["default_runtime_name"] == "nvidia"
    assert f'default runtime: nvidia (gpunode_nvidia_default_runtime); {CONFD}/10-site.toml sets "runc"' in (
        asked.dropin_text
    )


@pytest.mark.parametrize(("version", "schema", "plugin"), [(V17, 2, V2), (V21, 3, V3)])
def test_nvidia_keys_a_file_sets_are_kept_binary_named(version: Any, schema: int, plugin: str) -> None:
    body = (
        f"[plugins.{plugin}.containerd.runtimes.nvidia]\n  privileged_without_host_devices = true\n"
        f'[plugins.{plugin}.containerd.runtimes.nvidia.options]\n  SystemdCgroup = true\n  BinaryName = "/opt/nv/ncr"\n'
    )
    texts = cri_file(schema, plugin, body)
    result = plan(MAIN, texts, version, Options())
    nvidia = runtime_table(dropin(result), plugin)["containerd"]["runtimes"]["nvidia"]
    assert nvidia["privileged_without_host_devices"] is True
    assert nvidia["options"]["SystemdCgroup"] is True  # the default runtime (runc) has false
    assert nvidia["options"]["BinaryName"] == BINARY
    assert f'BinaryName = {BINARY} (gpunode_nvidia_runtime_binary; {CONFD}/10-site.toml sets "/opt/nv/ncr")' in (
        result.dropin_text
    )
    assert f"SystemdCgroup = true (as {CONFD}/10-site.toml sets it)" in result.dropin_text
    asked = plan(MAIN, texts, version, Options(systemd_cgroup=False))
    assert f"SystemdCgroup = false (set by gpunode_nvidia_systemd_cgroup; {CONFD}/10-site.toml sets true)" in (
        asked.dropin_text
    )


def test_imports_a_file_lists_are_kept() -> None:
    texts = {MAIN: 'version = 2\nimports = ["/etc/containerd/site/*.toml"]\n'}
    imports = tomllib.loads(plan(MAIN, texts, V17, Options()).config_text)["imports"]
    assert imports[0] == "/etc/containerd/site/*.toml"


def dump(schema: int, enable_cdi: bool) -> dict[str, Any]:
    plugin = "io.containerd.cri.v1.runtime" if schema >= 3 else "io.containerd.grpc.v1.cri"
    runtimes = {
        name: {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": BINARY}}
        for name in ("runc", "nvidia")
    }
    return {"version": schema, "plugins": {plugin: {"enable_cdi": enable_cdi, "containerd": {"runtimes": runtimes}}}}


@pytest.mark.parametrize("schema", [2, 3, 4])
def test_gate_refuses_turning_on_cdi_a_file_turns_off(schema: int) -> None:
    texts = cri_file(2 if schema == 2 else 3, V2 if schema == 2 else V3, "")
    plugin = V2 if schema == 2 else V3
    texts[f"{CONFD}/10-site.toml"] += f"[plugins.{plugin}]\n  enable_cdi = false\n"
    result = plan(MAIN, texts, V17 if schema == 2 else V21, Options())
    found = candidate_losses(dump(schema, False), dump(schema, True), [], [], result.intended, BINARY, result.user_set)
    assert any(f"enable_cdi is set to False in {CONFD}/10-site.toml; the candidate makes it True" in f for f in found)


# Schema as containerd applies it.


def test_version_2_with_version_3_names_on_2x_writes_where_containerd_reads() -> None:
    """A version 2 tree whose runtimes sit under the version-3 name, a version-2 table setting only
    ``enable_cdi``: containerd migrates key by key, the version-3 table winning."""
    main = f"""version = 2
{IMPORTS}
[plugins.{V3}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.{V3}.containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins.{V2}]
  max_container_log_line_size = 100
"""
    data = dropin(plan(MAIN, {MAIN: main}, V21, Options()))
    assert data["version"] == 2
    v3 = data["plugins"]["io.containerd.cri.v1.runtime"]
    assert v3["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert set(data["plugins"]["io.containerd.grpc.v1.cri"]) == {"enable_cdi", "cdi_spec_dirs"}
    plain = dropin(plan(MAIN, {MAIN: "version = 2\n"}, V21, Options()))
    assert list(plain["plugins"]) == ["io.containerd.grpc.v1.cri"]


# Version 4 (containerd 2.3+): the example containerd's own manual gives for version 4
# (docs/man/containerd-config.toml.5.md, v2.3.0), with a CRI runtime section added.
V4_CONFIG = f"""version = 4

root = "/var/lib/containerd"
state = "/run/containerd"
oom_score = 0
imports = ["{CONFD}/*.toml"]

[plugins."io.containerd.server.v1.grpc"]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.server.v1.debug"]
  address = "/run/containerd/debug.sock"
  level = "info"

[plugins.{V3}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.{V3}.containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def test_version_4_config_on_containerd_23() -> None:
    data = dropin(plan(MAIN, {MAIN: V4_CONFIG}, V23, Options()))
    assert data["version"] == 4
    nvidia = data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"BinaryName": BINARY, "SystemdCgroup": True}


def test_version_4_needs_containerd_23() -> None:
    errors = plan(MAIN, {MAIN: V4_CONFIG}, V21, Options()).errors
    assert errors == [
        f"{MAIN}: key 'version' = 4 is not supported by containerd 2.1 here (version 4 needs containerd 2.3 or later)"
    ]


def test_dropin_carries_the_files_version_never_the_dumps() -> None:
    """containerd 2.3 dumps version 4 whatever the file says: a version 2 root keeps version 2 drop-ins."""
    v2_dump = {
        "version": 4,
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {"runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2"}}}
            }
        },
    }
    assert summarize(v2_dump)["runtimes"] == {
        "runc": {"runtime_type": "io.containerd.runc.v2", "BinaryName": None, "SystemdCgroup": None}
    }
    result = plan(MAIN, {MAIN: "version = 2\n"}, V23, Options(), {"runtime_type": "io.containerd.runc.v2"})
    assert dropin(result)["version"] == 2
    assert tomllib.loads(result.config_text)["version"] == 2


def test_a_dropin_newer_than_the_root_is_left_to_the_binary_from_23() -> None:
    """containerd 2.3+ migrates each file on its own: v2.3.0-v2.3.4 refuse a newer drop-in (their dump
    fails, and the candidate check quotes it: tests/integration), 2.3.5+ and 2.4 merge it. The plan states no
    rule of its own there; on 2.1, which migrates the merged tree by the last version, it warns."""
    texts = {MAIN: "version = 2\n" + IMPORTS, f"{CONFD}/99-nvidia.toml": "version = 3\n"}
    on_23 = plan(MAIN, texts, V23, Options())
    assert (on_23.errors, on_23.warnings) == ([], [])
    on_21 = plan(MAIN, texts, V21, Options())
    assert on_21.errors == []
    assert on_21.warnings == [
        f"{CONFD}/99-nvidia.toml: version = 3 differs from config.toml's version = 2; containerd may drop its settings"
    ]


def test_a_new_wording_of_the_account_is_no_reason_to_rewrite_our_dropin() -> None:
    """A file an earlier version wrote differs only in its account lines: it is not rewritten (and
    containerd not restarted); a key, a value or a ``# carried-from`` line still counts."""
    from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, same_meaning

    header = "# Managed by pyinfra-gpunode: the nvidia runtime for containerd's CRI plugin.\n"
    body = '\nversion = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n'
    old = header + "#   runtime nvidia: runc's settings\n# carried-from containerd.x /etc/containerd/config.toml\n"
    new = header + "#   runtime nvidia: copied from runtime runc (the default runtime)\n"
    new += "# carried-from containerd.x /etc/containerd/config.toml\n"
    assert same_meaning(OUR_DROPIN, old + body, new + body)
    assert not same_meaning(OUR_DROPIN, old + body, new + body.replace('"runc"', '"nvidia"'))
    assert not same_meaning(OUR_DROPIN, old + body, new.replace("config.toml", "conf.d/a.toml") + body)
    assert not same_meaning(OUR_DROPIN, None, new + body)
    assert not same_meaning("/etc/containerd/config.toml", old + body, new + body)
