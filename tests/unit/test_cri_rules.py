"""Pure logic: the CRI plugin's start rules applied to a merged config (dump dicts and file texts)."""

from __future__ import annotations

from typing import Any

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN
from pyinfra_gpunode.containerd_files import load_order, missing_imports, resolve_tree
from pyinfra_gpunode.cri_rules import START_RULES, cri_start_findings, import_findings, stopping
from pyinfra_gpunode.go_duration import parsed_duration
from pyinfra_gpunode.versions import ContainerdVersionInfo

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


def line(major: int, minor: int) -> ContainerdVersionInfo:
    return {"major": major, "minor": minor, "patch": 0, "raw": f"{major}.{minor}.0", "build": "test"}


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
    text = f'version = 3\n[plugins."{V3}".containerd]\n  default_runtime_name = ""\n'
    assert messages(dump2(empty), {MAIN: text}) == [
        f'plugins."{V3}".containerd.default_runtime_name is empty (in {MAIN}): the CRI plugin refuses to start '
        '("`default_runtime_name` is empty")'
    ]
    assert 'containerd` `default_runtime_name = "runc"")' in messages(dump1(nvidia_only))[0]


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


def test_stream_idle_timeout_that_is_no_duration_is_refused_on_1x_and_2x() -> None:
    """The CRI gRPC plugin's own key (its server config on 2.x, under the same plugin name)."""
    text = f"version = 3\n{IMPORTS}"
    site = f'version = 3\n[plugins."{V2}"]\n  stream_idle_timeout = "forever"\n'
    texts = {MAIN: text, f"{CONFD}/20-stream.toml": site}
    dump = dump2()
    dump["plugins"][V2] = {"stream_idle_timeout": "forever"}
    (finding,) = cri_start_findings(dump, files(texts))
    assert finding.stops_cri
    assert finding.message == (
        f"plugins.\"{V2}\".stream_idle_timeout = 'forever' (in {CONFD}/20-stream.toml) is not a duration: the CRI "
        'plugin refuses to start ("invalid stream idle timeout: time: invalid duration "forever""); write one such '
        'as "4h0m0s"'
    )
    (message,) = messages(dump1({"stream_idle_timeout": "5"}))
    assert '("invalid stream idle timeout: time: missing unit in duration "5"")' in message
    for good in ("4h0m0s", "0", "", "1.5h", "-1m"):
        assert messages(dump1({"stream_idle_timeout": good})) == [], good


def go_duration_error(text: str) -> str | None:
    return parsed_duration(text)[1]


def test_go_duration_errors_are_go_s_own() -> None:
    """``time.ParseDuration``'s errors, as Go 1.27 gives them (the cases compared against Go itself)."""
    assert go_duration_error("4h0m0s") is None
    assert go_duration_error("-9223372036854775808ns") is None  # the smallest Duration
    assert go_duration_error("1\u00b5s") is None and go_duration_error("1\u03bcs") is None
    assert go_duration_error(".5s") is None and go_duration_error("1.s") is None
    assert go_duration_error("forever") == 'time: invalid duration "forever"'
    assert go_duration_error("") == 'time: invalid duration ""'
    assert go_duration_error(".s") == 'time: invalid duration ".s"'
    assert go_duration_error("5") == 'time: missing unit in duration "5"'
    assert go_duration_error("1e5s") == 'time: unknown unit "e" in duration "1e5s"'
    assert go_duration_error("4h ") == 'time: unknown unit "h " in duration "4h "'
    assert go_duration_error("9223372036854775808ns") == 'time: invalid duration "9223372036854775808ns"'
    assert go_duration_error("2562048h") == 'time: invalid duration "2562048h"'
    assert go_duration_error('a"b\\c') == 'time: invalid duration "a\\"b\\\\c"'
    assert go_duration_error("1h\u00e9") == 'time: unknown unit "h\\xc3\\xa9" in duration "1h\\xc3\\xa9"'


UNTRUSTED = {"runtime_type": "io.containerd.runc.v2"}


def test_untrusted_workload_runtime_beside_runtimes_untrusted_is_refused_on_1x() -> None:
    site = (
        f'version = 2\n[plugins."{V2}".containerd.untrusted_workload_runtime]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        f'[plugins."{V2}".containerd.runtimes.untrusted]\n  runtime_type = "io.containerd.runc.v2"\n'
    )
    texts = {MAIN: f"version = 2\n{IMPORTS}", f"{CONFD}/30-untrusted.toml": site}
    both = {
        "untrusted_workload_runtime": UNTRUSTED,
        "default_runtime_name": "runc",
        "runtimes": {"runc": RUNC, "untrusted": RUNC},
    }
    (finding,) = cri_start_findings(dump1({"containerd": both}), files(texts))
    assert finding.stops_cri
    assert finding.message == (
        f"plugins.\"{V2}\".containerd.untrusted_workload_runtime (runtime_type = 'io.containerd.runc.v2'; in "
        f'{CONFD}/30-untrusted.toml) and plugins."{V2}".containerd.runtimes.untrusted (in {CONFD}/30-untrusted.toml) '
        "both define the untrusted "
        'runtime: the CRI plugin refuses to start ("conflicting definitions: configuration includes both '
        '`untrusted_workload_runtime` and `runtimes["untrusted"]`"); keep runtimes.untrusted only'
    )
    # Either alone starts: the deprecated key becomes runtimes.untrusted; an empty one (its default) is none.
    alone = {**both, "runtimes": {"runc": RUNC}}
    assert messages(dump1({"containerd": alone})) == []
    empty = {**both, "untrusted_workload_runtime": {"runtime_type": ""}}
    assert messages(dump1({"containerd": empty})) == []


def test_each_start_rule_holds_only_on_its_lines() -> None:
    assert START_RULES["mirrors with config_path"].holds(None)
    assert START_RULES["tls with config_path"].holds(line(1, 7))
    assert not START_RULES["tls with config_path"].holds(line(2, 0))
    assert not START_RULES["cni bin_dir and bin_dirs"].holds(line(2, 0))
    assert START_RULES["cni bin_dir and bin_dirs"].holds(line(2, 1))
    assert START_RULES["cni bin_dir and bin_dirs"].holds(line(2, 4))
    assert START_RULES["untrusted_workload_runtime"].holds(line(1, 6))
    assert not START_RULES["untrusted_workload_runtime"].holds(line(2, 3))
    for rule in START_RULES.values():
        assert rule.since is None or rule.until is None or rule.since < rule.until
        assert rule.holds(line(1, 7)) or rule.holds(line(2, 1))  # every rule holds on some line


def test_a_rule_is_applied_only_on_the_versions_that_make_its_check() -> None:
    """The gate: given the node's version, a rule outside its range is silent; without one, every rule is
    applied as before. Each dump below is one a version outside the range would not print (its containerd
    drops the key), so only the gate keeps the rule from firing."""
    registry = {"config_path": "/etc/containerd/certs.d", "configs": {"r.example": {"tls": {"ca_file": "/ca"}}}}
    tls = dump1({"registry": registry})
    assert len(messages(tls)) == 1
    assert cri_start_findings(tls, [], version=line(1, 6)) != []
    assert cri_start_findings(tls, [], version=line(2, 1)) == []
    cni = dump2({"cni": {"bin_dir": "/usr/lib/cni", "bin_dirs": ["/opt/x"]}})
    text = f'version = 3\n[plugins."{V3}".cni]\n  bin_dirs = ["/opt/x"]\n'
    assert len(cri_start_findings(cni, files({MAIN: text}))) == 1
    assert len(cri_start_findings(cni, files({MAIN: text}), version=line(2, 1))) == 1
    assert cri_start_findings(cni, files({MAIN: text}), version=line(2, 0)) == []
    untrusted = dump1(
        {
            "containerd": {
                "untrusted_workload_runtime": UNTRUSTED,
                "default_runtime_name": "runc",
                "runtimes": {"runc": RUNC, "untrusted": RUNC},
            }
        }
    )
    assert len(cri_start_findings(untrusted, [], version=line(1, 7))) == 1
    assert cri_start_findings(untrusted, [], version=line(2, 0)) == []
    # Positional, as a caller passing ``missing`` first would.
    assert cri_start_findings(untrusted, [], (), line(2, 0)) == []
    # A rule every line makes holds whatever the version.
    mirrors = dump2(images={"registry": {"config_path": "/c", "mirrors": {"docker.io": {}}}})
    assert len(cri_start_findings(mirrors, [], version=line(2, 4))) == 1
