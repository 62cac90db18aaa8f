"""Pure logic: load order, imports editing, drop-in rendering, version parsing, redaction, modes and links."""

from __future__ import annotations

import tomllib

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, PROVENANCE, Options, carried_from, edit_imports, plan
from pyinfra_gpunode.containerd_dump import (
    candidate_losses,
    expected_after_restart,
    parse_cri_start_log,
    redacted,
    shown,
    summarize,
)
from pyinfra_gpunode.containerd_files import (
    links_in_the_way,
    load_order,
    missing_imports,
    not_regular_files,
    resolve_tree,
    strictest_mode,
    toml_data,
)
from pyinfra_gpunode.versions import parse_containerd_version

MAIN = "/etc/containerd/config.toml"
V17 = parse_containerd_version("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1")
V21 = parse_containerd_version("containerd github.com/containerd/containerd/v2 2.1.9+unknown ")


def paths(texts: dict[str, str]) -> list[str]:
    return [f["path"] for f in load_order(resolve_tree(MAIN, texts))]


def test_globs_load_in_byte_order() -> None:
    names = ["a-x", "Z-x", "99-registry", "99-nvidia", "9-x", "10-x", "100-x"]
    texts = {MAIN: 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'}
    texts |= {f"/etc/containerd/conf.d/{n}.toml": "" for n in names}
    order = [p.rsplit("/", 1)[1][:-5] for p in paths(texts)[1:]]
    assert order == ["10-x", "100-x", "9-x", "99-nvidia", "99-registry", "Z-x", "a-x"]


def test_nested_imports_are_breadth_first_without_duplicates() -> None:
    texts = {
        MAIN: 'version = 2\nimports = ["a.toml", "b.toml"]\n',
        "/etc/containerd/a.toml": 'imports = ["c.toml", "b.toml"]\n',
        "/etc/containerd/b.toml": "",
        "/etc/containerd/c.toml": 'imports = ["a.toml"]\n',
    }
    assert paths(texts) == [MAIN, "/etc/containerd/a.toml", "/etc/containerd/b.toml", "/etc/containerd/c.toml"]


def test_glob_star_does_not_cross_directories() -> None:
    texts = {
        MAIN: 'version = 2\nimports = ["/etc/containerd/*.toml"]\n',
        "/etc/containerd/conf.d/x.toml": "",
        "/etc/containerd/y.toml": "",
    }
    assert paths(texts) == [MAIN, "/etc/containerd/y.toml"]


def test_missing_import_and_outside_import_are_problems() -> None:
    tree = resolve_tree(MAIN, {MAIN: 'version = 2\nimports = ["/etc/containerd/gone.toml", "/opt/x/*.toml"]\n'})
    assert tree["problems"] == [
        f"{MAIN}: key 'imports' names /etc/containerd/gone.toml, which does not exist: containerd exits at "
        "start (open ...: no such file or directory), before any plugin loads",
        f"{MAIN}: key 'imports' entry '/opt/x/*.toml' is outside /etc/containerd",
    ]


def test_an_import_not_named_toml_is_not_called_missing() -> None:
    """Only ``*.toml`` files are read from the node: another name may exist there, unread."""
    texts = {MAIN: 'version = 2\nimports = ["/etc/containerd/site.conf"]\n'}
    assert missing_imports(MAIN, texts) == []
    assert resolve_tree(MAIN, texts)["problems"] == [
        f"{MAIN}: key 'imports' names /etc/containerd/site.conf, which gpunode does not read (it reads the "
        "*.toml files under /etc/containerd); rename it to end in .toml"
    ]


def test_edit_imports_keeps_comments_and_is_stable() -> None:
    text = 'version = 2\n# keep me\nimports = ["/etc/containerd/other/*.toml"]  # and me\n\n[plugins.x]\n  a = 1\n'
    edited = edit_imports(text, 2, Options())
    assert "# keep me" in edited and "# and me" in edited
    assert tomllib.loads(edited)["imports"] == [
        "/etc/containerd/other/*.toml",
        "/etc/containerd/conf.d/*.toml",
        OUR_DROPIN,
    ]
    assert edit_imports(edited, 2, Options()) == edited


def test_edit_imports_moves_our_file_last() -> None:
    text = f'version = 2\nimports = ["{OUR_DROPIN}", "/etc/containerd/conf.d/*.toml", "/etc/containerd/late/*.toml"]\n'
    assert tomllib.loads(edit_imports(text, 2, Options()))["imports"][-1] == OUR_DROPIN


def test_edit_imports_adds_the_key_before_the_first_table() -> None:
    edited = edit_imports('version = 2\n\n[plugins."x"]\n  a = 1\n', 2, Options())
    data = tomllib.loads(edited)
    assert "imports" in data and "imports" not in data["plugins"]["x"]


def test_missing_config_is_created_with_the_versions_schema() -> None:
    assert tomllib.loads(plan(MAIN, {}, V17, Options()).config_text)["version"] == 2
    result = plan(MAIN, {}, V21, Options())
    assert tomllib.loads(result.config_text)["version"] == 3
    assert "io.containerd.cri.v1.runtime" in tomllib.loads(result.dropin_text)["plugins"]


def test_rendering_is_byte_stable_and_parses_back() -> None:
    texts = {MAIN: 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/c"\n'}
    first, second = plan(MAIN, texts, V17, Options()), plan(MAIN, texts, V17, Options())
    assert first.dropin_text == second.dropin_text
    assert tomllib.loads(first.dropin_text) == first.dropin_data


def test_systemd_cgroup_follows_runc_unless_set() -> None:
    texts = {
        MAIN: 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n"
    }

    def nvidia(options: Options) -> dict:
        data = plan(MAIN, texts, V17, options).dropin_data
        return data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]["options"]

    assert nvidia(Options())["SystemdCgroup"] is True
    assert nvidia(Options(systemd_cgroup=False))["SystemdCgroup"] is False


def test_default_runtime_only_when_asked() -> None:
    def default(options: Options) -> str | None:
        data = plan(MAIN, {MAIN: "version = 3\n"}, V21, options).dropin_data
        return data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"].get("default_runtime_name")

    assert default(Options()) is None
    assert default(Options(default_runtime=True)) == "nvidia"


def test_16_gets_no_cdi_keys() -> None:
    v16 = parse_containerd_version("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3")
    cri = plan(MAIN, {}, v16, Options()).dropin_data["plugins"]["io.containerd.grpc.v1.cri"]
    assert "enable_cdi" not in cri and "cdi_spec_dirs" not in cri


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", (1, 6, 20)),
        ("containerd github.com/containerd/containerd/v2 v2.3.2 fff62f14.m", (2, 3, 2)),
        ("containerd github.com/containerd/containerd v1.7.9+azure 4f03e100", (1, 7, 9)),
        ("containerd github.com/containerd/containerd 1.7.2 ", (1, 7, 2)),
    ],
)
def test_containerd_versions(line: str, expected: tuple[int, int, int]) -> None:
    version = parse_containerd_version(line)
    assert version is not None
    assert (version["major"], version["minor"], version["patch"]) == expected


@pytest.mark.parametrize("line", ["", "ctr github.com/containerd/containerd/v2 2.1.9+unknown", "containerd x y"])
def test_unknown_version_forms(line: str) -> None:
    assert parse_containerd_version(line) is None


def test_unsupported_containerd_is_refused() -> None:
    old = parse_containerd_version("containerd github.com/containerd/containerd 1.5.9 x")
    assert plan(MAIN, {}, old, Options()).errors == ["containerd 1.5.9 is not supported (supported: 1.6, 1.7 and 2.x)"]


def test_credentials_are_redacted_with_layout_and_comments_kept() -> None:
    text = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.configs."r.example:5000".auth]\n'
        '  username = "u"\n  password = "p"\n'
        '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
        '  configs."r".auth = { username = "u", password = "p" }\n  x.identitytoken = "t"  # note\n'
    )
    lines = redacted(text).splitlines()
    assert lines[2:4] == ['  username = "<redacted>"', '  password = "<redacted>"']
    assert lines[5] == '  config_path = "/etc/containerd/certs.d"'
    assert lines[6:] == [
        '  configs."r".auth = { username = "<redacted>", password = "<redacted>" }',
        '  x.identitytoken = "<redacted>"  # note',
    ]
    assert shown("registry.configs.r.auth.password", "p") == "'<redacted>'"
    assert shown("registry.config_path", "/c") == "'/c'"


def test_modes_and_links_in_the_way() -> None:
    assert strictest_mode([]) == "644"
    assert strictest_mode(["600", "644"]) == "600"
    assert strictest_mode(["640", "604"]) == "600"
    links = {"/etc/containerd": "/srv/containerd", "/etc/containerd/conf.d/x.toml": "/srv/x.toml"}
    assert links_in_the_way([MAIN, OUR_DROPIN], links) == ["/etc/containerd is a symbolic link to /srv/containerd"]
    assert links_in_the_way([MAIN], {"/etc/containerd/conf.d/x.toml": "/srv/x.toml"}) == []


def test_an_existing_file_is_never_made_looser() -> None:
    assert strictest_mode(["644"], base="600") == "600"
    assert strictest_mode([], base="2640") == "640"


def test_anything_but_a_regular_file_where_we_write_is_named() -> None:
    kinds = {"/etc": "directory", "/etc/containerd": "directory", MAIN: "regular empty file"}
    assert not_regular_files([MAIN, OUR_DROPIN], kinds) == []
    kinds[OUR_DROPIN] = "directory"
    kinds["/etc/containerd/gpunode"] = "directory"
    assert not_regular_files([MAIN, OUR_DROPIN], kinds) == [f"{OUR_DROPIN} is a directory, not a regular file"]
    kinds = {"/etc/containerd": "directory", "/etc/containerd/gpunode": "regular file", MAIN: "fifo"}
    assert not_regular_files([MAIN, OUR_DROPIN], kinds) == [
        f"{MAIN} is a fifo, not a regular file",
        "/etc/containerd/gpunode is a regular file, not a directory",
    ]


def test_control_characters_in_inputs_are_refused() -> None:
    errors = plan(MAIN, {}, V17, Options(binary="/usr/bin/nvidia\n", cdi_spec_dirs=("/etc/cdi\t",))).errors
    assert errors == [
        "binary '/usr/bin/nvidia<U+000A>' contains a newline or another control character; give a plain absolute path",
        "cdi_spec_dirs entry '/etc/cdi<U+0009>' contains a newline or another control character; "
        "give a plain absolute path",
    ]
    # C1 too: U+009B is a terminal's escape on its own.
    errors = plan(MAIN, {}, V17, Options(dropin_dir="/etc/containerd/\x9bx")).errors
    assert errors == [
        "dropin_dir '/etc/containerd/<U+009B>x' contains a newline or another control character; give a plain "
        "absolute path"
    ]


def test_not_utf8_is_an_error_naming_the_byte() -> None:
    text = b"version = 2\n# caf\xe9\n".decode(errors="surrogateescape")
    main = resolve_tree(MAIN, {MAIN: text})["main"]
    assert main is not None and main["error"] == "not UTF-8: byte 0xe9 on line 2"


TOOLKIT = "/etc/containerd/conf.d/99-nvidia.toml"
SITE = "/etc/containerd/conf.d/10-site.toml"
CRI = '"io.containerd.grpc.v1.cri"'


def _written(texts: dict[str, str]) -> dict[str, str]:
    """The node's files once a plan of ``texts`` was written."""
    first = plan(MAIN, texts, V17, Options())
    assert not first.errors, first.errors
    return {**texts, MAIN: first.config_text, OUR_DROPIN: first.dropin_text}


def _tree() -> dict[str, str]:
    toolkit = (
        f'version = 2\n[plugins.{CRI}.containerd]\n  default_runtime_name = "nvidia-cdi"\n'
        f'[plugins.{CRI}.containerd.runtimes.nvidia-cdi]\n  runtime_type = "io.containerd.runc.v2"\n'
        f'[plugins.{CRI}.registry]\n  config_path = "/etc/containerd/certs.d-toolkit"\n'
    )
    site = f'version = 2\n[plugins.{CRI}.registry]\n  config_path = "/etc/containerd/certs.d"\n'
    return _written({MAIN: 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n', SITE: site, TOOLKIT: toolkit})


def test_carried_keys_record_their_file_and_parse_back() -> None:
    texts = _tree()
    assert carried_from(texts[OUR_DROPIN]) == {
        "containerd.default_runtime_name": TOOLKIT,
        "containerd.runtimes.nvidia-cdi.runtime_type": TOOLKIT,
        "registry.config_path": TOOLKIT,  # the last file setting it
    }
    assert carried_from(None) is None
    earlier = "#   kept CRI keys of /a.toml: x, y.z\n#   kept CRI keys of /b.toml: x\n\nversion = 2\n"
    assert carried_from(earlier) == {"x": "/b.toml", "y.z": "/a.toml"}  # an earlier version's account
    assert carried_from("# edited by hand\nversion = 2\n") is None


def test_removed_file_drops_its_keys_and_a_key_another_file_sets_stays() -> None:
    texts = _tree()
    del texts[TOOLKIT]
    result = plan(MAIN, texts, V17, Options())
    assert result.dropped_lines == [
        f"dropped containerd.default_runtime_name, containerd.runtimes.nvidia-cdi.runtime_type carried from "
        f"{TOOLKIT}, which was removed"
    ]
    assert result.intended["registry.config_path"] == "/etc/containerd/certs.d"  # the site file still sets it
    assert "nvidia-cdi" not in result.dropin_text and "registry.config_path" not in result.dropped


def test_file_no_longer_setting_its_keys_drops_them() -> None:
    texts = _tree()
    texts[TOOLKIT] = texts[TOOLKIT].split("[plugins")[0]
    result = plan(MAIN, texts, V17, Options())
    assert result.dropped_lines[0].endswith(f"{TOOLKIT}, which no longer sets them")


def test_file_no_longer_imported_drops_its_keys() -> None:
    extra = "/etc/containerd/extra.toml"
    main = 'version = 2\nimports = ["/etc/containerd/extra.toml", "/etc/containerd/conf.d/*.toml"]\n'
    texts = _written({MAIN: main, extra: f'version = 2\n[plugins.{CRI}.registry]\n  config_path = "/x"\n'})
    texts[MAIN] = texts[MAIN].replace('"/etc/containerd/extra.toml", ', "")
    result = plan(MAIN, texts, V17, Options())
    assert result.dropped_lines == [f"dropped registry.config_path carried from {extra}, which is no longer imported"]


def test_an_edited_source_record_leaves_only_its_keys_unknown() -> None:
    texts = _tree()
    lines = texts[OUR_DROPIN].splitlines(keepends=True)
    mangled = [line[:40] + "\n" if line.startswith(PROVENANCE) and TOOLKIT in line else line for line in lines]
    texts[OUR_DROPIN] = "".join(mangled)
    del texts[TOOLKIT]
    result = plan(MAIN, texts, V17, Options())
    assert carried_from(texts[OUR_DROPIN]) == {}
    assert (result.dropped, result.provenance_unknown) == ({}, False)  # the gate then judges them as before


def _dump(runtimes: dict[str, str], default: str = "runc") -> dict:
    tables = {
        name: {"runtime_type": "io.containerd.runc.v2", "sandbox_mode": "podsandbox", "options": {"BinaryName": binary}}
        for name, binary in runtimes.items()
    }
    return {
        "version": 2,
        "plugins": {"io.containerd.grpc.v1.cri": {"containerd": {"default_runtime_name": default, "runtimes": tables}}},
    }


def test_gate_counts_dropped_keys_as_intent_and_nothing_else() -> None:
    binary = "/usr/bin/nvidia-container-runtime"
    before = _dump({"runc": "", "nvidia": binary, "nvidia-cdi": "x", "kata": "k"}, default="nvidia-cdi")
    after = _dump({"runc": "", "nvidia": binary})
    dropped = {"containerd.runtimes.nvidia-cdi.runtime_type": TOOLKIT, "containerd.default_runtime_name": TOOLKIT}
    losses = candidate_losses(before, after, [], [], {}, binary, {}, dropped)
    assert losses == ["runtime kata would be lost"] + [
        f"io.containerd.grpc.v1.cri:containerd.runtimes.kata.{key} would change from {value!r} to <unset>"
        for key, value in (
            ("options.BinaryName", "k"),
            ("runtime_type", "io.containerd.runc.v2"),
            ("sandbox_mode", "podsandbox"),
        )
    ]
    assert "runtime nvidia-cdi would be lost" in candidate_losses(before, after, [], [], {}, binary, {})


def test_restart_expects_the_previous_runtimes_less_the_dropped_ones() -> None:
    summary = summarize(_dump({"runc": "", "nvidia": "/usr/bin/nvidia-container-runtime"}))
    previous = parse_cri_start_log([])
    previous["runtimes"] = ["nvidia", "nvidia-cdi", "kata", "runc"]
    assert expected_after_restart(summary, previous)["runtimes"] == ["kata", "nvidia", "nvidia-cdi", "runc"]
    assert expected_after_restart(summary, previous, ["nvidia-cdi"])["runtimes"] == ["kata", "nvidia", "runc"]


def test_a_dump_warning_read_at_two_moments_is_the_same_warning() -> None:
    from pyinfra_gpunode.facts.containerd import _process_dump

    def read(at: str) -> list[str]:
        stderr = f'time="{at}" level=warning msg="Ignoring unknown key in TOML for plugin" key="registry configs r tls"'
        return _process_dump(["version = 2", "### gpunode-stderr", stderr, "### gpunode-rc 0"])["warnings"]

    assert read("2026-12-01T17:43:17Z") == read("2026-12-01T17:43:18Z")
    assert read("2026-12-01T17:43:17Z") == [
        'level=warning msg="Ignoring unknown key in TOML for plugin" key="registry configs r tls"'
    ]


def test_dumps_of_many_nodes_share_their_keys() -> None:
    from pyinfra_gpunode.facts.containerd import _process_dump

    text = [
        "version = 2",
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]',
        'BinaryName = "/usr/bin/nvidia-container-runtime"',
        '[[plugins."io.containerd.transfer.v1.local".unpack_config]]',
        'platform = "linux/amd64"',
    ]
    first, second = (_process_dump([*text, "### gpunode-stderr", "### gpunode-rc 0"])["dump"] for _ in range(2))
    assert first == second == tomllib.loads("\n".join(text))

    def keys(table: object) -> list[str]:
        if isinstance(table, dict):
            return [found for key, value in table.items() for found in (key, *keys(value))]
        return [found for item in table for found in keys(item)] if isinstance(table, list) else []

    assert len(keys(first)) == 11
    assert all(mine is theirs for mine, theirs in zip(keys(first), keys(second), strict=True))


def test_a_config_text_parsed_again_is_a_fresh_copy_of_the_same_data() -> None:
    text = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    first = toml_data(text)
    first["imports"].append("changed by a caller")
    assert toml_data(text) == {"version": 2, "imports": ["/etc/containerd/conf.d/*.toml"]}
