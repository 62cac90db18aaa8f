"""Pure logic: the CRI plugin's start rules applied to a merged config (dump dicts and file texts)."""

from __future__ import annotations

from typing import Any

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN
from pyinfra_gpunode.containerd_files import load_order, missing_imports, resolve_tree
from pyinfra_gpunode.cri_rules import cri_start_findings, import_findings, stopping

MAIN = "/etc/containerd/config.toml"
CONFD = "/etc/containerd/conf.d"
V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"
V3_IMAGES = "io.containerd.cri.v1.images"
RUNC = {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": False}}


def dump1(cri: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    """A containerd 1.x dump: one CRI plugin table."""
    table = {"containerd": {"default_runtime_name": "runc", "runtimes": {"runc": RUNC}}, "registry": {}}
    return {"version": 2, **top, "plugins": {V2: {**table, **(cri or {})}}}


def dump2(runtime: dict[str, Any] | None = None, images: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    """A containerd 2.x dump: runtime and images plugins, version 3."""
    table = {"containerd": {"default_runtime_name": "runc", "runtimes": {"runc": RUNC}}, "cni": {}}
    plugins = {V3: {**table, **(runtime or {})}, V3_IMAGES: {"registry": {}, **(images or {})}}
    return {"version": 3, **top, "plugins": plugins}


def files(texts: dict[str, str]) -> list:
    return load_order(resolve_tree(MAIN, texts))


def messages(dump: dict[str, Any], texts: dict[str, str] | None = None) -> list[str]:
    return [finding.message for finding in cri_start_findings(dump, files(texts or {}))]


IMPORTS = f'imports = ["{CONFD}/*.toml"]\n'


def test_a_plain_config_passes() -> None:
    assert messages(dump1()) == []
    assert messages(dump2()) == []
    assert stopping(cri_start_findings(dump1(), [])) is None


def test_mirrors_with_config_path_names_both_keys_and_their_files_on_2x() -> None:
    texts = {
        MAIN: f'version = 3\n{IMPORTS}[plugins."{V3_IMAGES}".registry.mirrors."docker.io"]\n  endpoint = ["https://m"]\n',
        f"{CONFD}/10-certs.toml": (
            f'version = 3\n[plugins."{V3_IMAGES}".registry]\n  config_path = "/etc/containerd/certs.d"\n'
        ),
    }
    registry = {"config_path": "/etc/containerd/certs.d", "mirrors": {"docker.io": {"endpoint": ["https://m"]}}}
    found = cri_start_findings(dump2(images={"registry": registry}), files(texts))
    assert [finding.stops_cri for finding in found] == [True]
    message = found[0].message
    assert f'plugins."{V3_IMAGES}".registry.mirrors (docker.io; in {MAIN})' in message
    assert f"config_path = '/etc/containerd/certs.d' (in {CONFD}/10-certs.toml)" in message
    assert "`mirrors` cannot be set when `config_path` is provided" in message


def test_on_1x_the_keys_are_named_in_the_file_that_owns_the_cri_plugin() -> None:
    """1.x: the last file with a CRI table owns the plugin; where that is our drop-in, it carries every file's keys."""
    mirrors = f'version = 2\n{IMPORTS}[plugins."{V2}".registry.mirrors."docker.io"]\n  endpoint = ["https://m"]\n'
    certs = f'version = 2\n[plugins."{V2}".registry]\n  config_path = "/etc/containerd/certs.d"\n'
    ours = (
        f'version = 2\n[plugins."{V2}".registry]\n  config_path = "/etc/containerd/certs.d"\n'
        f'[plugins."{V2}".registry.mirrors."docker.io"]\n  endpoint = ["https://m"]\n'
    )
    registry = {"config_path": "/etc/containerd/certs.d", "mirrors": {"docker.io": {"endpoint": ["https://m"]}}}
    main = mirrors.replace(IMPORTS, f'imports = ["{CONFD}/*.toml", "{OUR_DROPIN}"]\n')
    texts = {MAIN: main, f"{CONFD}/10-certs.toml": certs, OUR_DROPIN: ours}
    (message,) = messages(dump1({"registry": registry}), texts)
    assert f"mirrors (docker.io; in {MAIN}, {OUR_DROPIN})" in message
    assert f"(in {CONFD}/10-certs.toml, {OUR_DROPIN})" in message
    # Without our drop-in the registry drop-in alone owns the plugin: it is the one named.
    texts = {MAIN: mirrors, f"{CONFD}/10-certs.toml": ours}
    (message,) = messages(dump1({"registry": registry}), texts)
    assert f"mirrors (docker.io; in {CONFD}/10-certs.toml)" in message


def test_tls_configs_with_config_path_are_refused() -> None:
    registry = {
        "config_path": "/etc/containerd/certs.d",
        "configs": {"r.example": {"tls": {"insecure_skip_verify": True}}},
    }
    (message,) = messages(dump1({"registry": registry}))
    assert "configs.<host>.tls (r.example" in message
    assert "`configs.tls` cannot be set when `config_path` is provided" in message


def test_mirrors_without_config_path_pass() -> None:
    assert messages(dump1({"registry": {"config_path": "", "mirrors": {"docker.io": {}}}})) == []


def test_bin_dir_with_bin_dirs_is_refused_on_2x_only() -> None:
    cni = {"cni": {"bin_dir": "/usr/lib/cni", "bin_dirs": ["/opt/x"]}}
    text = f'version = 3\n[plugins."{V3}".cni]\n  bin_dir = "/usr/lib/cni"\n  bin_dirs = ["/opt/x"]\n'
    (finding,) = cri_start_findings(dump2(cni), files({MAIN: text}))
    assert finding.stops_cri
    assert f"plugins.\"{V3}\".cni.bin_dir = '/usr/lib/cni' (in {MAIN})" in finding.message
    assert "`cni.bin_dir` and `cni.bin_dirs` cannot be set at the same time" in finding.message
    # 1.x has no bin_dirs (an unknown key there); 2.x drops its own default bin_dirs where bin_dir is set.
    assert messages(dump1({"cni": {"bin_dir": "/usr/lib/cni", "bin_dirs": ["/opt/x"]}}), {MAIN: text}) == []
    only_dir = f'version = 3\n[plugins."{V3}".cni]\n  bin_dir = "/usr/lib/cni"\n'
    default = {"cni": {"bin_dir": "/usr/lib/cni", "bin_dirs": ["/opt/cni/bin"]}}
    assert messages(dump2(default), {MAIN: only_dir}) == []


def test_a_disabled_cri_plugin_is_named_first_and_alone() -> None:
    text = f'version = 2\ndisabled_plugins = ["{V2}"]\n'
    dump = {"version": 2, "disabled_plugins": [V2], "plugins": {}}  # no CRI table: nothing else to judge
    (finding,) = cri_start_findings(dump, files({MAIN: text}))
    assert finding.stops_cri
    assert finding.message.startswith(f"the CRI plugin is disabled: disabled_plugins names {V2} (in {MAIN})")
    assert "runtime" not in finding.message
    dump = dump2(disabled_plugins=[V3])
    assert messages(dump)[0].startswith(f"the CRI plugin is disabled: disabled_plugins names {V3}")


def test_default_runtime_no_runtime_defines_is_refused() -> None:
    text = f'version = 2\n[plugins."{V2}".containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
    nvidia_only = {"containerd": {"default_runtime_name": "runc", "runtimes": {"nvidia": RUNC}}}
    (finding,) = cri_start_findings(dump1(nvidia_only), files({MAIN: text}))
    assert finding.stops_cri
    assert "default_runtime_name = 'runc' (in containerd's built-in default) names no runtime" in finding.message
    assert "(runtimes: nvidia)" in finding.message
    empty = {"containerd": {"default_runtime_name": "", "runtimes": {"runc": RUNC}}}
    assert messages(dump2(empty)) == [
        f'plugins."{V3}".containerd.default_runtime_name is empty: the CRI plugin refuses to start'
    ]


def test_a_runtime_without_runtime_type_is_named_but_does_not_stop_cri() -> None:
    text = f'version = 3\n[plugins."{V3}".containerd.runtimes.crun.options]\n  BinaryName = "/usr/bin/crun"\n'
    crun = {
        "containerd": {
            "default_runtime_name": "runc",
            "runtimes": {"runc": RUNC, "crun": {"runtime_type": "", "options": {"BinaryName": "/usr/bin/crun"}}},
        }
    }
    found = cri_start_findings(dump2(crun), files({MAIN: text}))
    assert [finding.stops_cri for finding in found] == [False]
    assert f"runtimes.crun sets no runtime_type (in {MAIN})" in found[0].message
    assert stopping(found) is None


def test_one_option_in_two_spellings_is_named() -> None:
    text = f'version = 3\n[plugins."{V3}".containerd.runtimes.runc.options]\n  systemdCgroup = true\n'
    runc = {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": False, "systemdCgroup": True}}
    found = cri_start_findings(
        dump2({"containerd": {"default_runtime_name": "runc", "runtimes": {"runc": runc}}}), files({MAIN: text})
    )
    assert [finding.stops_cri for finding in found] == [False]
    assert (
        "runtimes.runc.options sets one option in 2 spellings (SystemdCgroup = False, systemdCgroup = True"
        in found[0].message
    )
    assert f"in {MAIN})" in found[0].message
    nvidia = {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": "/a", "binaryName": "/b"}}
    dump = dump1({"containerd": {"default_runtime_name": "runc", "runtimes": {"runc": RUNC, "nvidia": nvidia}}})
    assert "BinaryName = '/a', binaryName = '/b'" in messages(dump)[0]


def test_required_cri_plugin_says_the_whole_daemon_exits() -> None:
    text = f'version = 2\nrequired_plugins = ["{V2}"]\n'
    registry = {"config_path": "/etc/containerd/certs.d", "mirrors": {"docker.io": {}}}
    found = cri_start_findings(dump1({"registry": registry}, required_plugins=[V2]), files({MAIN: text}))
    assert [finding.stops_cri for finding in found] == [True, True]
    assert found[1].message == (
        f"required_plugins names {V2} (in {MAIN}): "
        "the whole containerd daemon would exit at start, not only its CRI plugin"
    )
    assert stopping(found) == f"{found[0].message}; {found[1].message}"
    # Required but nothing wrong: nothing to say.
    assert messages(dump1(required_plugins=[V2])) == []


def test_a_main_file_disabling_cri_by_its_id_is_named_first() -> None:
    """Docker's containerd.io file: ``disabled_plugins = ["cri"]`` and no ``version``."""
    from pyinfra_gpunode.containerd_dropin import Options, plan

    version = {"major": 1, "minor": 7, "patch": 24, "raw": "1.7.24"}
    result = plan(
        "/etc/containerd/config.toml",
        {"/etc/containerd/config.toml": 'disabled_plugins = ["cri"]\n'},
        version,  # type: ignore[arg-type]
        Options(binary="/usr/bin/nvidia-container-runtime"),
        None,
    )
    assert result.errors[0].startswith("/etc/containerd/config.toml: the CRI plugin is disabled"), result.errors


EXITS = "containerd exits at start (open ...: no such file or directory), before any plugin loads"


def missing_messages(texts: dict[str, str], dump: dict[str, Any] | None = None) -> list[str]:
    """The findings for a tree as ``cri_start_problem`` judges the node's: its missing imports first."""
    found = cri_start_findings(dump or dump1(), files(texts), missing_imports(MAIN, texts))
    assert all(finding.stops_cri for finding in found)
    return [finding.message for finding in found]


def test_an_import_naming_our_missing_drop_in_stops_containerd() -> None:
    """config.toml as gpunode writes it names its drop-in by path: without the file containerd does not start."""
    texts = {MAIN: f'version = 2\nimports = ["{CONFD}/*.toml", "{OUR_DROPIN}"]\n'}
    assert missing_messages(texts) == [
        f"{MAIN}: key 'imports' names {OUR_DROPIN}, which does not exist: {EXITS}; put the file back or "
        f"remove the entry ({OUR_DROPIN} is gpunode's drop-in: a run writes it again)"
    ]
    texts[OUR_DROPIN] = "version = 2\n"
    assert missing_messages(texts) == []


def test_a_missing_import_comes_alone_whatever_the_dump_says() -> None:
    """containerd exits before any plugin: 2.x's dump is then what it merged before the missing file."""
    texts = {MAIN: f'version = 2\nimports = ["{CONFD}/10-site.toml"]\n'}
    nvidia_only = {"containerd": {"default_runtime_name": "runc", "runtimes": {"nvidia": RUNC}}}
    (message,) = missing_messages(texts, dump1(nvidia_only, disabled_plugins=[V2]))
    assert message.startswith(f"{MAIN}: key 'imports' names {CONFD}/10-site.toml, which does not exist: {EXITS}")
    assert "gpunode's drop-in" not in message
    assert stopping(import_findings(missing_imports(MAIN, texts))) == message


def test_a_relative_entry_is_named_as_written_and_as_resolved() -> None:
    """A relative entry resolves against the importing file's directory (nested imports included)."""
    texts = {
        MAIN: f'version = 2\nimports = ["{CONFD}/*.toml"]\n',
        f"{CONFD}/10-site.toml": 'version = 2\nimports = ["../site/extra.toml", "gone.toml"]\n',
        "/etc/containerd/site/extra.toml": "version = 2\n",
    }
    assert missing_messages(texts) == [
        f"{CONFD}/10-site.toml: key 'imports' entry 'gone.toml' names {CONFD}/gone.toml, which does not exist: "
        f"{EXITS}; put the file back or remove the entry"
    ]


def test_a_glob_matching_nothing_and_an_outside_path_are_no_missing_import() -> None:
    """A glob matching nothing starts on every version; a file outside /etc/containerd is not read, so not judged."""
    texts = {MAIN: f'version = 2\nimports = ["{CONFD}/*.toml", "/opt/site/x.toml", "{CONFD}/site.conf"]\n'}
    assert missing_imports(MAIN, texts) == []
    assert missing_messages(texts) == []
