"""The real-binary matrix: Debian's containerd 1.6.20, 1.7.24 and 2.1.9, and 2.3.4 and a 2.4 build from upstream
source, judge our files.

Each scenario is a real ``/etc/containerd`` tree in a private mount namespace; the project's
own fact commands read it, the pure logic plans the files, and ``containerd config dump``
(and, for some, the daemon itself) says what containerd makes of them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import (
    CRI_V2,
    OUR_DROPIN,
    PROVENANCE,
    PROVENANCE_HEAD,
    Options,
    Plan,
    flatten,
    plan,
    staged_imports,
)
from pyinfra_gpunode.containerd_dump import candidate_losses, expected_warning, parse_cri_start_log, runc_runtime
from pyinfra_gpunode.containerd_files import load_order, resolve_tree, strictest_mode
from pyinfra_gpunode.cri_rules import cri_start_findings
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdVersion,
    candidate_input,
)
from pyinfra_gpunode.operations.containerd import Registration
from tests.realbin.namespace import ScenarioHost
from tests.realbin.scenarios import (
    CONFD,
    CONFIG,
    IMPORTS,
    UPSTREAM,
    debian_config,
    main_with_cri,
    nvidia_default_image,
    registry,
    runc_cgroup_only,
    toolkit_dropin,
)

pytestmark = pytest.mark.containerd
VERSIONS = ["1.6.20", "1.7.24", "2.1.9", *UPSTREAM]
V2X = [version for version in VERSIONS if version.startswith("2.")]
BINARY = "/usr/bin/nvidia-container-runtime"


@dataclass
class Expect:
    runtimes: set[str] = field(default_factory=lambda: {"nvidia", "runc"})
    config_path: str | None = None
    default: str = "runc"
    nvidia_systemd_cgroup: bool = False
    markers: dict[str, object] = field(default_factory=dict)


def scenario(name: str, version: str) -> tuple[dict[str, str], Expect]:
    """Files of a named scenario and what the merged config must show once we are done."""
    if name == "no_config":
        return {}, Expect()
    if name == "debian":
        cni = {"cni.bin_dirs": ["/usr/lib/cni"]} if version.startswith("2.") else {"cni.bin_dir": "/usr/lib/cni"}
        return {CONFIG: debian_config(version)}, Expect(markers=cni)
    if name == "main_cri":
        schema = 3 if version.startswith("2.") else 2
        marker = (
            {"device_ownership_from_security_context": True} if schema == 3 else {"max_container_log_line_size": 12345}
        )
        return {CONFIG: main_with_cri(schema)}, Expect(
            config_path="/etc/containerd/certs.d-main", nvidia_systemd_cgroup=True, markers=marker
        )
    if name == "main_cri_v2":
        return {CONFIG: main_with_cri(2)}, Expect(
            config_path="/etc/containerd/certs.d-main",
            nvidia_systemd_cgroup=True,
            markers={"max_container_log_line_size": 12345},
        )
    if name == "registry_first":
        return {CONFIG: debian_config(version), f"{CONFD}/10-registry.toml": registry()}, Expect(
            config_path="/etc/containerd/certs.d"
        )
    if name == "registry_last":
        main = debian_config(version).replace("version = 2\n", "version = 2\n" + IMPORTS, 1)
        files = {CONFIG: main, f"{CONFD}/zz-registry.toml": registry()}
        return files, Expect(config_path="/etc/containerd/certs.d")
    if name == "toolkit_and_registry":
        return {
            CONFIG: "version = 2\n" + IMPORTS,
            f"{CONFD}/99-nvidia.toml": toolkit_dropin(),
            f"{CONFD}/99-registry.toml": registry(),
        }, Expect(
            runtimes={"nvidia", "nvidia-cdi", "nvidia-legacy", "runc"},
            config_path="/etc/containerd/certs.d",
            default="nvidia",
            nvidia_systemd_cgroup=True,  # as the toolkit's drop-in sets it, not following runc
        )
    schema = 3 if version.startswith("2.") else 2
    if name == "runc_cgroup_only":
        # Kubernetes' docs snippet, then a registry drop-in: on 1.x the drop-in owned CRI until now.
        files = {CONFIG: runc_cgroup_only(schema), f"{CONFD}/10-registry.toml": registry(schema=schema)}
        cgroup = {"containerd.runtimes.runc.options.SystemdCgroup": True}
        return files, Expect(config_path="/etc/containerd/certs.d", nvidia_systemd_cgroup=True, markers=cgroup)
    if name == "runc_cgroup_only_alone":
        cgroup = {"containerd.runtimes.runc.options.SystemdCgroup": True}
        return {CONFIG: runc_cgroup_only(schema)}, Expect(nvidia_systemd_cgroup=True, markers=cgroup)
    if name == "nvidia_default_image":
        # No runc: the default runtime is nvidia and the image defines no runc (2.x keeps its own).
        return {CONFIG: nvidia_default_image(schema)}, Expect(
            runtimes={"nvidia"}, default="nvidia", nvidia_systemd_cgroup=True
        )
    raise KeyError(name)


SCENARIOS = ["no_config", "debian", "main_cri", "registry_first", "registry_last", "toolkit_and_registry"]
CASES = (
    [(v, s) for v in VERSIONS for s in SCENARIOS]
    + [(v, "main_cri_v2") for v in V2X]
    + [(v, "runc_cgroup_only") for v in VERSIONS]
    + [(v, "runc_cgroup_only_alone") for v in ("1.6.20", "1.7.24")]
    + [(v, "nvidia_default_image") for v in ("1.7.24", *V2X)]
)


def build(tmp_path: Path, version: str, files: dict[str, str]) -> ScenarioHost:
    host = ScenarioHost(tmp_path, version)
    for path, text in files.items():
        host.write(path, text)
    return host


def assert_ready(summary: dict, expect: Expect, version: str) -> None:
    runtimes = summary["runtimes"]
    assert expect.runtimes <= set(runtimes), runtimes
    assert runtimes["nvidia"]["BinaryName"] == BINARY
    assert bool(runtimes["nvidia"]["SystemdCgroup"]) is expect.nvidia_systemd_cgroup
    assert summary["default_runtime_name"] in (expect.default, None if expect.default == "runc" else expect.default)
    assert (summary["default_runtime_name"] or "runc") in runtimes
    if expect.config_path:
        assert summary["registry_config_path"] == expect.config_path
    if version != "1.6.20":
        assert summary["enable_cdi"] is True
        assert summary["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]


def cri_table(dump: dict, version: str) -> dict:
    name = "io.containerd.cri.v1.runtime" if version.startswith("2.") else "io.containerd.grpc.v1.cri"
    return dump["plugins"][name]


def apply_plan(host: ScenarioHost, options: Options | None = None):
    files = host.fact(ContainerdConfigFiles)
    version = host.fact(ContainerdVersion)
    runc = runc_runtime(host.fact(ContainerdConfigDump)["dump"])
    result = plan(files["main_path"], files["texts"], version, options or Options(), runc)
    assert not result.errors, result.errors
    return files, result


def candidate(host: ScenarioHost, result: Plan, config_text: str | None = None, dropin_text: str | None = None):
    """The staged dump of the planned files (or of the texts given), as registration reads it."""
    config = staged_imports(result.config_text if config_text is None else config_text)
    dropin = result.dropin_text if dropin_text is None else dropin_text
    return host.fact(
        ContainerdCandidateDump, config_path=CONFIG, dropin_path=OUR_DROPIN, _stdin=candidate_input(config, dropin)
    )


def losses(before: dict, after: dict, result: Plan) -> list[str]:
    return candidate_losses(
        before["dump"],
        after["dump"],
        before["warnings"],
        after["warnings"],
        result.intended,
        BINARY,
        result.user_set,
        result.dropped,
    )


@pytest.mark.parametrize(("version", "name"), CASES)
def test_matrix(tmp_path: Path, version: str, name: str) -> None:
    files_in, expect = scenario(name, version)
    host = build(tmp_path, version, files_in)
    before = host.fact(ContainerdConfigDump)
    files, result = apply_plan(host)

    staged = candidate(host, result)
    assert staged["error"] is None, staged["error"]
    assert_ready(staged["summary"], expect, version)
    assert losses(before, staged, result) == []
    texts = {**files["texts"], CONFIG: result.config_text, OUR_DROPIN: result.dropin_text}
    assert cri_start_findings(staged["dump"], load_order(resolve_tree(CONFIG, texts))) == []

    host.write(CONFIG, result.config_text)
    host.write(OUR_DROPIN, result.dropin_text)
    after = host.fact(ContainerdConfigDump)
    assert after["error"] is None
    assert [warning for warning in after["warnings"] if not expected_warning(warning)] == []
    assert_ready(after["summary"], expect, version)
    for key, value in expect.markers.items():
        table = cri_table(after["dump"], version)
        for part in key.split("."):
            table = table[part]
        assert table == value, key

    # A second plan from the written files changes nothing.
    _files, again = apply_plan(host)
    assert (again.config_text, again.dropin_text) == (result.config_text, result.dropin_text)


def test_main_config_comments_kept(tmp_path: Path) -> None:
    host = build(tmp_path, "1.7.24", {CONFIG: main_with_cri(2)})
    _files, result = apply_plan(host)
    assert "# operator's own CRI settings" in result.config_text
    assert result.config_text.count("imports") == 1


@pytest.mark.parametrize("version", ["1.6.20", "1.7.24"])
def test_field_incident_reproduced_then_fixed(tmp_path: Path, version: str) -> None:
    """A registry drop-in loading after the toolkit's drop-in erases every nvidia runtime on 1.x."""
    files_in, expect = scenario("toolkit_and_registry", version)
    host = build(tmp_path, version, files_in)
    broken = host.fact(ContainerdConfigDump)["summary"]
    assert not {"nvidia", "nvidia-cdi", "nvidia-legacy"} & set(broken["runtimes"])
    assert broken["registry_config_path"] == "/etc/containerd/certs.d"

    _files, result = apply_plan(host)
    host.write(CONFIG, result.config_text)
    host.write(OUR_DROPIN, result.dropin_text)
    assert_ready(host.fact(ContainerdConfigDump)["summary"], expect, version)


@pytest.mark.parametrize("version", ["1.7.24", *V2X])
def test_user_dropin_added_later_cannot_erase_nvidia(tmp_path: Path, version: str) -> None:
    """Our file is imported by name after the glob: a new registry drop-in sorting last loses on 1.x too."""
    host = build(tmp_path, version, {CONFIG: debian_config(version)})
    _files, result = apply_plan(host)
    host.write(CONFIG, result.config_text)
    host.write(OUR_DROPIN, result.dropin_text)
    host.write(f"{CONFD}/zzzz-registry.toml", registry("/etc/containerd/certs.d-late"))
    summary = host.fact(ContainerdConfigDump)["summary"]
    assert "nvidia" in summary["runtimes"] and "runc" in summary["runtimes"]

    # The next run carries the late drop-in's registry setting into our file.
    _files, again = apply_plan(host)
    host.write(OUR_DROPIN, again.dropin_text)
    assert host.fact(ContainerdConfigDump)["summary"]["registry_config_path"] == "/etc/containerd/certs.d-late"


def test_candidate_gate_catches_a_naive_dropin(tmp_path: Path) -> None:
    """The staged check with the real 1.7 binary reports what an nvidia-only drop-in would lose."""
    host = build(tmp_path, "1.7.24", {CONFIG: main_with_cri(2)})
    before = host.fact(ContainerdConfigDump)
    naive = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        f'  BinaryName = "{BINARY}"\n'
    )
    config = main_with_cri(2).replace(IMPORTS, f'imports = ["{CONFD}/*.toml", "{OUR_DROPIN}"]\n')
    staged = candidate(host, Plan(CONFIG), config, naive)
    text = "\n".join(losses(before, staged, Plan(CONFIG)))
    assert "runtime runc would be lost" in text
    assert "registry.config_path would change from '/etc/containerd/certs.d-main'" in text
    assert "max_container_log_line_size would change from 12345" in text


@pytest.mark.parametrize("version", ["1.6.20", "1.7.24"])
def test_runc_cgroup_snippet_is_fixed_not_refused(tmp_path: Path, version: str) -> None:
    """The field report on 1.7.24: only runc's SystemdCgroup in config.toml, a registry drop-in after it.

    containerd dumps ``runtime_type = ""`` for such a runc; our file carries runc with the
    runtime_type containerd fills in, the gate passes and the nvidia runtime is registered.
    """
    files_in, expect = scenario("runc_cgroup_only", version)
    host = build(tmp_path, version, files_in)
    before = host.fact(ContainerdConfigDump)
    _files, result = apply_plan(host)
    runc = result.dropin_data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2" and runc["options"] == {"SystemdCgroup": True}
    staged = candidate(host, result)
    assert losses(before, staged, result) == []
    assert staged["dump"]["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["runtime_type"] == (
        "io.containerd.runc.v2"
    )
    assert_ready(staged["summary"], expect, version)


@pytest.mark.parametrize("version", ["1.7.24", *V2X])
def test_user_set_nvidia_cgroup_is_kept_and_guarded(tmp_path: Path, version: str) -> None:
    """A GPU image's config.toml sets nvidia's SystemdCgroup = true with no runc: it stays true, and a
    candidate that changes it (here: one following runc's default) is refused naming the file."""
    host = build(tmp_path, version, {CONFIG: nvidia_default_image(3 if version.startswith("2.") else 2)})
    before = host.fact(ContainerdConfigDump)
    assert before["summary"]["runtimes"]["nvidia"]["SystemdCgroup"] is True
    _files, result = apply_plan(host)
    assert "SystemdCgroup = true (as /etc/containerd/config.toml sets it)" in result.dropin_text
    assert losses(before, candidate(host, result), result) == []

    following_runc = result.dropin_text.replace("SystemdCgroup = true", "SystemdCgroup = false")
    text = "\n".join(losses(before, candidate(host, result, dropin_text=following_runc), result))
    assert "containerd.runtimes.nvidia.options.SystemdCgroup is set to True in /etc/containerd/config.toml" in text


@pytest.mark.parametrize("version", ["1.7.24", "2.1.9"])
@pytest.mark.parametrize("link", ["config.toml", "directory"])
def test_candidate_staging_never_writes_through_links(tmp_path: Path, version: str, link: str) -> None:
    """A symlinked config.toml or /etc/containerd: the staged dump reads through the link and writes
    nothing outside its own temporary directory; the files fact names the link."""
    schema = 3 if version.startswith("2.") else 2
    text = f"version = {schema}\n{IMPORTS}"
    host = build(tmp_path, version, {})
    if link == "config.toml":
        host.write("/etc/k8s/containerd.toml", text)
        host.link(CONFIG, "/etc/k8s/containerd.toml")
        host.write(f"{CONFD}/10-registry.toml", registry(schema=schema))
    else:
        host.write("/etc/k8s/config.toml", text)
        host.write("/etc/k8s/conf.d/10-registry.toml", registry(schema=schema))
        host.link("/etc/containerd", "/etc/k8s")
    tree = host.snapshot()
    files, result = apply_plan(host)
    assert files["links"] == (
        {CONFIG: "/etc/k8s/containerd.toml"} if link == "config.toml" else {"/etc/containerd": "/etc/k8s"}
    )
    staged = candidate(host, result)
    assert host.snapshot() == tree
    assert staged["error"] is None, staged["error"]
    assert_ready(staged["summary"], Expect(config_path="/etc/containerd/certs.d"), version)


def test_candidate_larger_than_an_argument_is_judged(tmp_path: Path) -> None:
    """A config.toml of 160 KiB (comments kept) travels on stdin, not in one argument of the command."""
    comments = "".join(f"# operator note {i}: " + "x" * 100 + "\n" for i in range(1400))
    host = build(tmp_path, "1.7.24", {CONFIG: "version = 2\n" + comments})
    before = host.fact(ContainerdConfigDump)
    _files, result = apply_plan(host)
    assert len(candidate_input(result.config_text, result.dropin_text)) > 200_000
    staged = candidate(host, result)
    assert staged["error"] is None, staged["error"]
    assert "nvidia" in staged["summary"]["runtimes"]
    assert losses(before, staged, result) == []


def test_candidate_without_stdin_is_an_error(tmp_path: Path) -> None:
    host = build(tmp_path, "1.7.24", {CONFIG: "version = 2\n"})
    staged = host.fact(ContainerdCandidateDump, config_path=CONFIG, dropin_path=OUR_DROPIN, _stdin="")
    assert staged["error"] == "could not stage the candidate: no candidate config on stdin"


def test_plan_diff_and_gate_messages_redact_credentials(tmp_path: Path) -> None:
    """A registry password in a user's 0600 drop-in: our 1.x file carries it (mode 0600); the dry run's
    diff and the gate's messages show ``<redacted>`` instead."""
    secret = "s3cret-PASS-4242"
    auth = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.configs."registry.example:5000".auth]\n'
        f'  username = "puller"\n  password = "{secret}"\n'
    )
    host = build(tmp_path, "1.7.24", {CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/99-auth.toml": auth})
    (host.upper / "containerd/conf.d/99-auth.toml").chmod(0o600)
    before = host.fact(ContainerdConfigDump)
    files, result = apply_plan(host)
    assert secret in result.dropin_text and result.sources == [f"{CONFD}/99-auth.toml"]
    assert strictest_mode([files["modes"][path] for path in result.sources]) == "600"
    diff = Registration(writes={OUR_DROPIN: result.dropin_text}, modes={OUR_DROPIN: "600"}).diff()
    assert 'password = "<redacted>"' in diff and "(planned, mode 600)" in diff
    assert secret not in diff

    changed = result.dropin_text.replace(secret, "another-secret")
    text = "\n".join(losses(before, candidate(host, result, dropin_text=changed), result))
    assert "auth.password is set to '<redacted>' in /etc/containerd/conf.d/99-auth.toml" in text
    assert secret not in text and "another-secret" not in text


@pytest.mark.parametrize("path", [CONFIG, f"{CONFD}/50-latin1.toml"])
def test_non_utf8_file_is_named(tmp_path: Path, path: str) -> None:
    host = build(tmp_path, "1.7.24", {CONFIG: "version = 2\n" + IMPORTS})
    host.write(path, b"version = 2\n# caf\xe9 au lait\n")
    files = host.fact(ContainerdConfigFiles)
    result = plan(files["main_path"], files["texts"], host.fact(ContainerdVersion), Options())
    assert any(f"{path}: invalid TOML: not UTF-8: byte 0xe9 on line 2" in error for error in result.errors), result


@pytest.mark.parametrize(
    ("version", "path", "text", "needle"),
    [
        ("1.7.24", f"{CONFD}/50-broken.toml", "this is = = not toml\n", "50-broken.toml: invalid TOML"),
        ("1.7.24", CONFIG, "version = 1\n", "key 'version' = 1 is not supported"),
        ("2.1.9", f"{CONFD}/10-outside.toml", 'version = 3\nimports = ["/opt/elsewhere/*.toml"]\n', "outside"),
        ("1.7.24", CONFIG, '[plugins."io.containerd.grpc.v1.cri"]\n  x = 1\n', "key 'version' is missing"),
    ],
)
def test_bad_input_is_named(tmp_path: Path, version: str, path: str, text: str, needle: str) -> None:
    files_in = {CONFIG: "version = 2\n" + IMPORTS} if path != CONFIG else {}
    host = build(tmp_path, version, {**files_in, path: text})
    files = host.fact(ContainerdConfigFiles)
    result = plan(files["main_path"], files["texts"], host.fact(ContainerdVersion), Options())
    assert any(needle in error for error in result.errors), result.errors


def test_default_runtime_naming_no_runtime_is_refused(tmp_path: Path) -> None:
    dropin = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "crun"\n'
    host = build(tmp_path, "1.7.24", {CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/20-crun.toml": dropin})
    files = host.fact(ContainerdConfigFiles)
    result = plan(files["main_path"], files["texts"], host.fact(ContainerdVersion), Options())
    assert result.errors == [
        f"{CONFD}/20-crun.toml: key 'default_runtime_name' = 'crun' names no runtime defined in any file"
    ]


@pytest.mark.daemon
@pytest.mark.parametrize("name", ["toolkit_and_registry", "main_cri", "runc_cgroup_only"])
def test_daemon_loads_nvidia_and_runc(tmp_path: Path, name: str) -> None:
    files_in, _expect = scenario(name, "1.7.24")
    host = build(tmp_path, "1.7.24", files_in)
    _files, result = apply_plan(host)
    host.write(CONFIG, result.config_text)
    host.write(OUR_DROPIN, result.dropin_text)
    loaded = parse_cri_start_log(host.run_daemon().splitlines())
    assert loaded["loaded"], loaded
    assert {"nvidia", "runc"} <= set(loaded["runtimes"])
    assert loaded["enable_cdi"] is True
    assert loaded["registry_config_path"] in ("/etc/containerd/certs.d", "/etc/containerd/certs.d-main")


@pytest.mark.daemon
def test_daemon_without_runc_fails_cri(tmp_path: Path) -> None:
    """The failure our 1.x drop-in prevents: an nvidia-only drop-in removes runc and the CRI plugin fails."""
    nvidia_only = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
    )
    host = build(tmp_path, "1.7.24", {CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/99-nvidia.toml": nvidia_only})
    loaded = parse_cri_start_log(host.run_daemon().splitlines())
    assert loaded["loaded"] is False
    assert "no corresponding runtime configured" in (loaded["error"] or "")


SITE = f"{CONFD}/10-site.toml"
TOOLKIT = f"{CONFD}/99-nvidia.toml"


def toolkit_then_removed(tmp_path: Path, version: str) -> tuple[ScenarioHost, Plan]:
    """Debian's config.toml, a site drop-in (registry, cni conf_dir) and the toolkit's drop-in, planned and
    written; then the toolkit's drop-in is deleted (as the toolkit does when it exits)."""
    site = registry() + '\n[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_dir = "/etc/cni/site.d"\n'
    host = build(tmp_path, version, {CONFIG: debian_config(version), SITE: site, TOOLKIT: toolkit_dropin()})
    _files, first = apply_plan(host)
    host.write(CONFIG, first.config_text)
    host.write(OUR_DROPIN, first.dropin_text)
    loaded = host.fact(ContainerdConfigDump)["summary"]
    assert {"nvidia-cdi", "nvidia-legacy"} <= set(loaded["runtimes"]) and loaded["default_runtime_name"] == "nvidia"
    host.remove(TOOLKIT)
    return host, first


@pytest.mark.parametrize("version", ["1.6.20", "1.7.24"])
def test_removed_dropin_is_dropped_not_refused(tmp_path: Path, version: str) -> None:
    """The toolkit's drop-in is deleted: its runtimes leave as the user's intent, the other files' keys stay."""
    host, _first = toolkit_then_removed(tmp_path, version)
    before = host.fact(ContainerdConfigDump)
    assert "nvidia-cdi" in before["summary"]["runtimes"]  # our file still carries them
    _files, result = apply_plan(host)
    assert result.dropped_lines == [
        "dropped containerd.default_runtime_name, containerd.runtimes.nvidia-cdi.options.BinaryName, "
        "containerd.runtimes.nvidia-cdi.options.SystemdCgroup, containerd.runtimes.nvidia-cdi.runtime_type, "
        "containerd.runtimes.nvidia-legacy.options.BinaryName, "
        "containerd.runtimes.nvidia-legacy.options.SystemdCgroup, "
        "containerd.runtimes.nvidia-legacy.runtime_type"
        + (", enable_cdi" if version == "1.6.20" else "")
        + f" carried from {TOOLKIT}, which was removed"
    ]
    staged = candidate(host, result)
    assert losses(before, staged, result) == []
    # Without the record of where the keys came from, the gate refuses the node (the behaviour before).
    unrecorded = candidate_losses(
        before["dump"],
        staged["dump"],
        before["warnings"],
        staged["warnings"],
        result.intended,
        BINARY,
        result.user_set,
    )
    assert "runtime nvidia-cdi would be lost" in unrecorded and "runtime nvidia-legacy would be lost" in unrecorded

    host.write(OUR_DROPIN, result.dropin_text)
    after = host.fact(ContainerdConfigDump)
    assert [warning for warning in after["warnings"] if not expected_warning(warning)] == []
    summary = after["summary"]
    assert set(summary["runtimes"]) == {"nvidia", "runc"}
    assert (summary["default_runtime_name"] or "runc") == "runc"
    assert summary["runtimes"]["nvidia"]["BinaryName"] == BINARY
    assert summary["registry_config_path"] == "/etc/containerd/certs.d"
    cni = cri_table(after["dump"], version)["cni"]
    assert (cni["bin_dir"], cni["conf_dir"]) == ("/usr/lib/cni", "/etc/cni/site.d")  # the remaining files' values
    assert TOOLKIT not in result.dropin_text
    # The next run changes nothing and drops nothing more.
    _files, again = apply_plan(host)
    assert (again.dropin_text, again.dropped_lines) == (result.dropin_text, [])


def earlier_version(text: str, files: dict[str, str]) -> str:
    """Our file as the version before the source record wrote it: an account line per file, no record."""
    kept = [
        f"#   kept CRI keys of {path}: {', '.join(sorted(flatten(table)))}\n"
        for path, table in ((path, tomllib.loads(files[path]).get("plugins", {}).get(CRI_V2)) for path in files)
        if table
    ]
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith((PROVENANCE, PROVENANCE_HEAD))]
    return "".join(lines[:3] + kept + lines[3:])


@pytest.mark.parametrize("version", ["1.6.20", "1.7.24"])
def test_managed_file_of_an_earlier_version(tmp_path: Path, version: str) -> None:
    """Its account lines say which file each key came from: read as the record, a removal is dropped.
    A file with no record at all (edited by hand) keeps the refusal: its keys are of unknown source."""
    files = {CONFIG: debian_config(version), SITE: registry(), TOOLKIT: toolkit_dropin()}
    host = build(tmp_path, version, files)
    _files, first = apply_plan(host)
    earlier = earlier_version(first.dropin_text, {SITE: files[SITE], TOOLKIT: files[TOOLKIT], CONFIG: files[CONFIG]})
    assert earlier != first.dropin_text and "kept CRI keys of" in earlier
    host.write(CONFIG, first.config_text)
    host.write(OUR_DROPIN, earlier)
    before = host.fact(ContainerdConfigDump)
    _files, upgrade = apply_plan(host)  # nothing removed: the same CRI section, now with the record
    assert upgrade.dropin_text == first.dropin_text and upgrade.dropped == {}
    assert losses(before, candidate(host, upgrade), upgrade) == []

    host.remove(TOOLKIT)
    _files, result = apply_plan(host)
    assert result.dropped_lines and result.dropped_lines[0].endswith(f"{TOOLKIT}, which was removed")
    assert losses(before, candidate(host, result), result) == []

    host.write(OUR_DROPIN, "".join(line for line in earlier.splitlines(keepends=True) if not line.startswith("#")))
    _files, unknown = apply_plan(host)
    assert unknown.provenance_unknown and unknown.dropped == {}
    assert "runtime nvidia-cdi would be lost" in losses(before, candidate(host, unknown), unknown)
