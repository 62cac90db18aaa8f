"""The CRI plugin's start rules against real containerd: Debian's 1.6.20, 1.7.24 and 2.1.9, and 2.3.4 and a
2.4 development build from upstream source.

Each tree's real ``config dump`` (and the staged candidate's, as ``registration`` judges it) loads
without an error, so the dump gate lets it through; the rules refuse it, naming keys and files; and
the real daemon, started briefly in a private namespace, shows that its CRI plugin does refuse to
start, with the error text the rule quotes. Each rule of ``START_RULES`` that a config key breaks is run
on every binary whose containerd has the key, each one its range claims: ``stream_idle_timeout`` that is
no duration, an undefined or empty default runtime and ``mirrors`` with ``config_path`` on all five;
``untrusted_workload_runtime`` beside ``runtimes.untrusted`` and ``configs.<host>.tls`` with ``config_path``
on 1.x (2.0 dropped both keys: the dump drops them, the CRI plugin starts); ``cni.bin_dir`` with
``cni.bin_dirs`` from 2.1 (1.x has no ``bin_dirs``). One daemon start per rule and binary.

An ``imports`` entry naming a file that does not exist (not a glob) is the real daemons' ground truth
below, on 1.6.20, 1.7.24 and 2.1.9: each exits at start naming the path (a relative entry resolved
against the config file's directory); 1.6 and 1.7 fail ``config dump`` the same way, while 2.1.9's dump
exits 0 with no message and prints only what it merged before the missing file. A glob matching
nothing starts on all three.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, Options, plan, staged_imports
from pyinfra_gpunode.containerd_dump import runc_runtime
from pyinfra_gpunode.containerd_files import load_order, resolve_tree
from pyinfra_gpunode.cri_rules import START_RULES, cri_start_findings, stopping
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdVersion,
    candidate_input,
)
from pyinfra_gpunode.operations.containerd import cri_start_problem
from pyinfra_gpunode.versions import ContainerdVersionInfo, parse_containerd_version
from tests.realbin.namespace import ScenarioHost
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS, UPSTREAM

pytestmark = pytest.mark.containerd
VERSIONS = ["1.7.24", "2.1.9"]
ALL_VERSIONS = ["1.6.20", "1.7.24", "2.1.9"]
BINARIES = [*ALL_VERSIONS, *UPSTREAM]  # every real containerd the tests run
MIRRORS_TEXT = "`mirrors` cannot be set when `config_path` is provided"


def names(version: str) -> tuple[int, str, str]:
    """config version, CRI runtime plugin and CRI images plugin as a node of ``version`` writes them."""
    if version.startswith("2."):
        return 3, "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"
    return 2, "io.containerd.grpc.v1.cri", "io.containerd.grpc.v1.cri"


def mirrors_and_config_path(version: str) -> dict[str, str]:
    """The legacy ``registry.mirrors`` in config.toml plus a drop-in that sets ``config_path``."""
    schema, _runtime, images = names(version)
    return {
        CONFIG: f'version = {schema}\n{IMPORTS}\n[plugins."{images}".registry.mirrors."docker.io"]\n'
        '  endpoint = ["https://mirror.example"]\n',
        f"{CONFD}/50-certs.toml": f'version = {schema}\n[plugins."{images}".registry]\n'
        '  config_path = "/etc/containerd/certs.d"\n',
    }


def build(tmp_path: Path, version: str, files: dict[str, str]) -> ScenarioHost:
    host = ScenarioHost(tmp_path, version)
    for path, text in files.items():
        host.write(path, text)
    return host


def candidate(host: ScenarioHost) -> tuple[dict, list]:
    """The planned files' staged dump and the candidate tree's files, as ``registration`` reads them."""
    files = host.fact(ContainerdConfigFiles)
    runc = runc_runtime(host.fact(ContainerdConfigDump)["dump"])
    result = plan(files["main_path"], files["texts"], host.fact(ContainerdVersion), Options(), runc)
    assert not result.errors, result.errors
    staged = host.fact(
        ContainerdCandidateDump,
        config_path=CONFIG,
        dropin_path=OUR_DROPIN,
        _stdin=candidate_input(staged_imports(result.config_text), result.dropin_text),
    )
    texts = {**files["texts"], CONFIG: result.config_text, OUR_DROPIN: result.dropin_text}
    host.write(CONFIG, result.config_text)  # kept for the daemon run; the checks above read the node before
    host.write(OUR_DROPIN, result.dropin_text)
    return staged, load_order(resolve_tree(CONFIG, texts))


def cri_failures(log: str) -> list[str]:
    """The errors of the CRI gRPC plugin's ``failed to load plugin`` lines, as containerd wrote them (the
    log's quoting undone). 1.x: ``msg="failed to load plugin io.containerd.grpc.v1.cri" error="..."``;
    2.1 to 2.4: ``msg="failed to load plugin" error="..." id=io.containerd.grpc.v1.cri``, whose error
    carries that of the runtime or images plugin it needs where that one failed."""
    failures = []
    for line in log.splitlines():
        error = re.search(r'error="((?:[^"\\]|\\.)*)"', line)
        one_x = 'failed to load plugin io.containerd.grpc.v1.cri"' in line
        two_x = 'msg="failed to load plugin"' in line and re.search(r"\bid=io\.containerd\.grpc\.v1\.cri\b", line)
        if error and (one_x or two_x):
            failures.append(re.sub(r'\\(["\\])', r"\1", error.group(1)))
    return failures


def line_of(version: str) -> ContainerdVersionInfo:
    """``version`` as the ``ContainerdVersion`` fact reads a node's (``2.4.0-dev`` is the 2.4 line)."""
    info = parse_containerd_version(f"containerd github.com/containerd/containerd {version}")
    assert info is not None
    return info


@pytest.mark.parametrize("version", VERSIONS)
def test_mirrors_with_config_path_passes_the_dump_but_not_the_rules(tmp_path: Path, version: str) -> None:
    host = build(tmp_path, version, mirrors_and_config_path(version))
    current = host.fact(ContainerdConfigDump)
    assert current["error"] is None
    current_problem = stopping(
        cri_start_findings(current["dump"], load_order(resolve_tree(CONFIG, host.fact(ContainerdConfigFiles)["texts"])))
    )
    if version.startswith("1."):
        assert current_problem is None  # 1.x: the drop-in owns the CRI plugin, the mirrors are gone
    else:
        assert current_problem is not None and MIRRORS_TEXT in current_problem  # 2.x deep-merges: both kept

    staged, files = candidate(host)
    assert staged["error"] is None, staged["error"]  # the dump gate lets the candidate through
    found = cri_start_findings(staged["dump"], files)
    assert found and found[0].stops_cri
    message = found[0].message
    assert MIRRORS_TEXT in message
    assert f"(docker.io; in {CONFIG}" in message
    assert f"{CONFD}/50-certs.toml" in message


@pytest.mark.daemon
@pytest.mark.parametrize("version", BINARIES)
def test_real_cri_plugin_refuses_mirrors_with_config_path(tmp_path: Path, version: str) -> None:
    """What the rule stands for: written, the candidate takes the CRI plugin down at start (every line)."""
    assert START_RULES["mirrors with config_path"].holds(line_of(version))
    host = build(tmp_path, version, mirrors_and_config_path(version))
    staged, files = candidate(host)
    assert MIRRORS_TEXT in (stopping(cri_start_findings(staged["dump"], files, version=line_of(version))) or "")
    failures = cri_failures(host.run_daemon())
    assert any(MIRRORS_TEXT in failure for failure in failures), failures


def site_dropin(version: str, rule: str) -> str:
    """A drop-in that breaks ``rule``, as a node of ``version`` would carry it."""
    schema, runtime, images = names(version)
    runc = f'[plugins."{runtime}".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
    body = {
        "stream_idle_timeout": '[plugins."io.containerd.grpc.v1.cri"]\n  stream_idle_timeout = "forever"\n',
        # runc is defined beside it: on 1.x a drop-in's runtimes replace the built-in ones.
        "untrusted_workload_runtime": f'[plugins."{runtime}".containerd.untrusted_workload_runtime]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        f'[plugins."{runtime}".containerd.runtimes.untrusted]\n  runtime_type = "io.containerd.runc.v2"\n{runc}',
        "tls with config_path": f'[plugins."{images}".registry]\n  config_path = "/etc/containerd/certs.d"\n'
        f'[plugins."{images}".registry.configs."registry.example".tls]\n  insecure_skip_verify = true\n',
        "cni bin_dir and bin_dirs": f'[plugins."{runtime}".cni]\n  bin_dir = "/usr/lib/cni"\n'
        '  bin_dirs = ["/opt/cni/site"]\n',
        "default runtime undefined": f'[plugins."{runtime}".containerd]\n  default_runtime_name = "nvidia"\n',
        "default runtime empty": f'[plugins."{runtime}".containerd]\n  default_runtime_name = ""\n',
    }[rule]
    return f"version = {schema}\n{body}"


# containerd's own text for each rule's break above, and the binaries whose containerd has the rule's key:
# each is one the rule's range claims. The others ignore the key (their dump drops it) and start.
START_CASES = {
    "stream_idle_timeout": ('invalid stream idle timeout: time: invalid duration "forever"', BINARIES),
    "untrusted_workload_runtime": (
        'conflicting definitions: configuration includes both `untrusted_workload_runtime` and `runtimes["untrusted"]`',
        ALL_VERSIONS[:2],  # gone in 2.0
    ),
    "tls with config_path": (
        "`configs.tls` cannot be set when `config_path` is provided",
        ALL_VERSIONS[:2],  # 2.0 dropped registry.configs.<host>.tls (and the check)
    ),
    "cni bin_dir and bin_dirs": (
        "`cni.bin_dir` and `cni.bin_dirs` cannot be set at the same time",
        ["2.1.9", *UPSTREAM],  # bin_dirs came with 2.1
    ),
    "default runtime undefined": (
        "no corresponding runtime configured in `containerd.runtimes` for `containerd` "
        '`default_runtime_name = "nvidia"',
        BINARIES,
    ),
    "default runtime empty": ("`default_runtime_name` is empty", BINARIES),
}


def site_host(tmp_path: Path, version: str, rule: str) -> tuple[ScenarioHost, dict, list, ContainerdVersionInfo]:
    """A node whose drop-in breaks ``rule``: its host, real dump, files and real version."""
    host = build(
        tmp_path,
        version,
        {CONFIG: f"version = {names(version)[0]}\n{IMPORTS}", f"{CONFD}/50-site.toml": site_dropin(version, rule)},
    )
    dump = host.fact(ContainerdConfigDump)
    assert dump["error"] is None, dump["error"]  # the dump gate lets it through
    node = host.fact(ContainerdVersion)  # the binary's own, as registration reads it
    assert (node["major"], node["minor"]) == (line_of(version)["major"], line_of(version)["minor"]), node
    return host, dump["dump"], load_order(resolve_tree(CONFIG, host.fact(ContainerdConfigFiles)["texts"])), node


@pytest.mark.daemon
@pytest.mark.parametrize(
    ("rule", "version"), [(rule, version) for rule, case in START_CASES.items() for version in case[1]]
)
def test_real_cri_plugin_fails_on_each_start_rule(tmp_path: Path, rule: str, version: str) -> None:
    """The node's own tree: its range claims this containerd; the rule names key and file and quotes
    containerd, and the real CRI plugin fails at start with that very text."""
    text, _binaries = START_CASES[rule]
    host, dump, files, node = site_host(tmp_path, version, rule)
    assert START_RULES[rule].holds(node)
    problem = stopping(cri_start_findings(dump, files, version=node))
    assert problem is not None and text in problem and f"(in {CONFD}/50-site.toml" in problem, problem
    failures = cri_failures(host.run_daemon())
    assert any(text in failure for failure in failures), failures


@pytest.mark.parametrize(
    ("rule", "version"),
    [(rule, version) for rule, case in START_CASES.items() for version in BINARIES if version not in case[1]],
)
def test_a_line_without_the_key_drops_it_and_the_rule_is_silent(tmp_path: Path, rule: str, version: str) -> None:
    """Where containerd has no such key (2.x: untrusted_workload_runtime, configs.<host>.tls; 1.x: cni.bin_dirs)
    its dump drops it and no rule fires, given the version or not. (Its daemon ignores the key and starts the
    CRI plugin, seen on each of these binaries; not run here, to keep the daemon starts few.)"""
    text, _binaries = START_CASES[rule]
    _host, dump, files, node = site_host(tmp_path, version, rule)
    assert not START_RULES[rule].holds(node)
    assert text not in (stopping(cri_start_findings(dump, files, version=node)) or "")
    assert text not in (stopping(cri_start_findings(dump, files)) or "")


@pytest.mark.daemon
def test_required_cri_plugin_makes_the_real_daemon_exit(tmp_path: Path) -> None:
    files = mirrors_and_config_path("2.1.9")
    files[CONFIG] = files[CONFIG].replace(
        "version = 3\n", 'version = 3\nrequired_plugins = ["io.containerd.grpc.v1.cri"]\n'
    )
    host = build(tmp_path, "2.1.9", files)
    dump = host.fact(ContainerdConfigDump)
    assert dump["error"] is None
    found = cri_start_findings(
        dump["dump"], load_order(resolve_tree(CONFIG, host.fact(ContainerdConfigFiles)["texts"]))
    )
    assert "the whole containerd daemon would exit" in found[-1].message
    assert "containerd: load required plugin io.containerd.grpc.v1.cri: " in host.run_daemon()


@pytest.mark.parametrize("version", VERSIONS)
def test_disabled_cri_plugin_is_named_not_a_missing_runtime(tmp_path: Path, version: str) -> None:
    """A drop-in disables the CRI plugin (config.toml itself doing so is refused by the planner)."""
    schema, _runtime, _images = names(version)
    dropin = f"{CONFD}/10-no-cri.toml"
    host = build(
        tmp_path,
        version,
        {
            CONFIG: f"version = {schema}\n{IMPORTS}",
            dropin: f'version = {schema}\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n',
        },
    )
    staged, files = candidate(host)
    assert staged["error"] is None, staged["error"]
    (finding,) = cri_start_findings(staged["dump"], files)
    assert finding.message.startswith(
        f"the CRI plugin is disabled: disabled_plugins names io.containerd.grpc.v1.cri (in {dropin})"
    )


def test_bin_dir_with_bin_dirs_passes_the_dump_but_not_the_rules(tmp_path: Path) -> None:
    cni = (
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".cni]\n'
        '  bin_dir = "/usr/lib/cni"\n  bin_dirs = ["/opt/cni/site"]\n'
    )
    host = build(tmp_path, "2.1.9", {CONFIG: f"version = 3\n{IMPORTS}", f"{CONFD}/20-cni.toml": cni})
    staged, files = candidate(host)
    assert staged["error"] is None, staged["error"]
    (finding,) = cri_start_findings(staged["dump"], files)
    assert finding.stops_cri
    assert f"bin_dir = '/usr/lib/cni' (in {CONFD}/20-cni.toml)" in finding.message
    assert "cannot be set at the same time" in finding.message


@pytest.mark.parametrize("version", VERSIONS)
def test_runc_option_in_lower_case_is_refused_in_two_spellings(tmp_path: Path, version: str) -> None:
    """``systemdCgroup`` (containerd reads it as ``SystemdCgroup``) ends up next to ``SystemdCgroup``: on 2.x
    the dump merges it over runc's defaults, on 1.x the nvidia runtime copies runc's options."""
    schema, runtime, _images = names(version)
    runc = (
        f'version = {schema}\n[plugins."{runtime}".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        f'[plugins."{runtime}".containerd.runtimes.runc.options]\n  systemdCgroup = true\n'
    )
    host = build(tmp_path, version, {CONFIG: f"version = {schema}\n{IMPORTS}", f"{CONFD}/10-runc.toml": runc})
    staged, files = candidate(host)
    assert staged["error"] is None, staged["error"]
    found = [finding.message for finding in cri_start_findings(staged["dump"], files)]
    assert any(
        "options sets one option in 2 spellings" in message and "systemdCgroup = True" in message for message in found
    ), found


def exit_line(version: str, path: str) -> str:
    """The line containerd prints as it exits at start on an import of ``path`` that does not exist."""
    if version.startswith("1."):
        return f"containerd: failed to load TOML: {path}: open {path}: no such file or directory"
    return f"containerd: open {path}: no such file or directory"


def our_dropin_gone(tmp_path: Path, version: str) -> ScenarioHost:
    """A node gpunode wrote (config.toml names our drop-in by path), whose drop-in someone then removed."""
    schema, _runtime, _images = names(version)
    host = build(tmp_path, version, {CONFIG: f"version = {schema}\n"})
    candidate(host)
    assert OUR_DROPIN in (host.read(CONFIG) or "")
    host.remove(OUR_DROPIN)
    return host


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_config_dump_on_an_import_naming_a_missing_file(tmp_path: Path, version: str) -> None:
    """1.x's dump fails as its daemon does; 2.x's dump succeeds silently with the files before the missing one."""
    schema, _runtime, _images = names(version)
    missing = "/etc/containerd/site/missing.toml"
    host = build(
        tmp_path,
        version,
        {
            CONFIG: f'version = {schema}\nimports = ["/etc/containerd/a.toml", "site/missing.toml", '
            '"/etc/containerd/b.toml"]\n',
            "/etc/containerd/a.toml": f"version = {schema}\noom_score = -111\n",
            "/etc/containerd/b.toml": f"version = {schema}\nroot = '/var/lib/containerd-from-b'\n",
        },
    )
    dump = host.fact(ContainerdConfigDump)
    if version.startswith("1."):
        assert dump["error"] == exit_line(version, missing), dump
    else:
        assert dump["error"] is None and dump["warnings"] == [], dump
        assert dump["dump"]["oom_score"] == -111  # a.toml, before the missing file, is merged
        assert dump["dump"]["root"] != "/var/lib/containerd-from-b"  # b.toml, after it, is not


@pytest.mark.daemon
@pytest.mark.parametrize("version", ALL_VERSIONS)
@pytest.mark.parametrize("case", ["our drop-in gone", "relative entry", "glob matching nothing"])
def test_real_daemon_on_an_import_naming_a_missing_file(tmp_path: Path, version: str, case: str) -> None:
    """Ground truth: a named file that does not exist stops the daemon at start; an empty glob does not.
    (The daemon runs on a copy of config.toml in its state directory: a relative entry resolves there.)"""
    schema, _runtime, _images = names(version)
    if case == "our drop-in gone":
        host, path = our_dropin_gone(tmp_path, version), OUR_DROPIN
    elif case == "relative entry":
        host = build(tmp_path, version, {CONFIG: f'version = {schema}\nimports = ["site/10-site.toml"]\n'})
        path = str(tmp_path / "daemon" / "site" / "10-site.toml")
    else:
        host, path = build(tmp_path, version, {CONFIG: f"version = {schema}\n{IMPORTS}"}), ""
    log = host.run_daemon()
    if path:
        assert exit_line(version, path) in log, log
        assert "containerd successfully booted" not in log
        assert not re.search("Start cri plugin|starting cri plugin", log)
    else:
        assert "containerd successfully booted" in log, log
        assert cri_failures(log) == []


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_missing_named_import_on_the_node_is_named_and_the_plan_writes_our_drop_in_back(
    tmp_path: Path, version: str
) -> None:
    """The node's tree as the facts read it: the rule names file, key and path, whatever the dump says; the
    planner writes the drop-in again, and the candidate loads."""
    host = our_dropin_gone(tmp_path, version)
    files = host.fact(ContainerdConfigFiles)
    assert OUR_DROPIN not in files["texts"]
    problem = cri_start_problem(host.fact(ContainerdConfigDump), CONFIG, files["texts"])
    assert problem is not None
    assert problem.startswith(f"{CONFIG}: key 'imports' names {OUR_DROPIN}, which does not exist: containerd exits")
    staged, candidate_files = candidate(host)
    assert staged["error"] is None, staged["error"]
    assert [config["path"] for config in candidate_files][-1] == OUR_DROPIN
    assert stopping(cri_start_findings(staged["dump"], candidate_files)) is None
