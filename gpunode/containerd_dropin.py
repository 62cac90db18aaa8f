"""Compute the nvidia runtime drop-in and the main config's ``imports`` (no I/O).

Our drop-in is imported by name as the **last** entry of config.toml's ``imports``, after the
user's drop-in glob, so no user drop-in can load after it:

- containerd 1.6/1.7: the last file that touches the CRI plugin owns the whole plugin. Our file
  carries the CRI section as the user meant it (the main config's CRI keys, then every
  drop-in's, deep-merged in load order), plus runc if absent, the nvidia runtime and CDI.
  It is recomputed from the other files on every run, so a user drop-in added later takes
  effect at the next run instead of erasing the nvidia runtime. Its header records which file
  each carried key came from (``# carried-from`` lines): a key whose file was removed, is no
  longer imported or no longer sets it is dropped at the next run as the user's intent.
- containerd 2.x deep-merges: our file holds only the keys we own (the nvidia runtime,
  ``enable_cdi``/``cdi_spec_dirs`` where no file sets them or host data asks, and the default
  runtime when asked), with config.toml's ``version``. A version 2 tree on 2.x is migrated by
  containerd key by key, a version-3 plugin name winning over the version-2 one: each key goes
  under the name whose table containerd takes it from.

The nvidia runtime is a copy of the default runtime's entry (as ``nvidia-ctk runtime configure``
builds it) with our ``BinaryName``; a value a file sets for a key we write is kept unless host
data asks for another by name, and the plan says which.

NRI mode (``gpunode_containerd_mode: nri``, for the GPU Operator's NRI plugin) registers no runtime:
our file turns on containerd's NRI plugin (``io.containerd.nri.v1.nri``, off by default on 1.7, on
from 2.0) and CDI, by the same rule (a file's ``disable = true`` is kept unless host data asks).
On 1.7 the last file naming the NRI plugin owns it as it owns CRI: our file carries the other
files' NRI keys too. An nvidia runtime our previous file registered is dropped, and the plan says so.
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import tomlkit
from jinja2 import Environment, StrictUndefined

from pyinfra_gpunode import node_json, node_toml
from pyinfra_gpunode.containerd_files import CONFIG_ROOT, ConfigFile, load_order, parsed, resolve_tree
from pyinfra_gpunode.log import CONTROL, without_controls
from pyinfra_gpunode.memo import by_content
from pyinfra_gpunode.settings import CONTAINERD_MODE, DROPIN_DIR, RUNTIME_BINARY
from pyinfra_gpunode.versions import ContainerdVersionInfo

CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_V3_RUNTIME = "io.containerd.cri.v1.runtime"
CRI_V3_IMAGES = "io.containerd.cri.v1.images"
# What disabled_plugins may name the CRI plugin by: its URIs, or its ID alone ("cri", as Docker's file does).
CRI_NAMES = (CRI_V2, CRI_V3_RUNTIME, CRI_V3_IMAGES, "cri")
RUNC_V2 = "io.containerd.runc.v2"
RUNTIME = "nvidia"
# Runtime keys containerd fills in itself when a file leaves them empty or unset.
FILLED_IN = {"runtime_type": RUNC_V2, "sandbox_mode": "podsandbox"}
OUR_DROPIN = "/etc/containerd/gpunode/nvidia-runtime.toml"
PROVENANCE = "# carried-from "
ACCOUNT = "#   "  # the header's account lines: what the planner decided and why, in words


def same_meaning(path: str, current: str | None, planned: str) -> bool:
    """Whether the file at ``path`` already says what ``planned`` says: the same text, or for our drop-in
    the same text but for its account lines (a new wording of the account is no reason to rewrite the
    file and restart containerd; keys, values and ``# carried-from`` lines still count)."""
    if current == planned:
        return True
    if current is None or path != OUR_DROPIN:
        return False

    def meaning(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith(ACCOUNT)]

    return meaning(current) == meaning(planned)


_EARLIER = re.compile(r"^#   kept CRI keys of (/.*?): (\S.*)$")
PROVENANCE_HEAD = "# The file each carried CRI key came from (read back by the next run; keep each line intact):"


CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # containerd's own default
NRI = "io.containerd.nri.v1.nri"
# What disabled_plugins may name the NRI plugin by: its URI, or its ID alone.
NRI_NAMES = (NRI, "nri")
NRI_SINCE = (1, 7)  # containerd's NRI plugin came with 1.7 (off by default there, on from 2.0)
MODES = ("runtime", "nri")
PURPOSE = {
    "runtime": "the nvidia runtime for containerd's CRI plugin.",
    "nri": "NRI and CDI for the GPU Operator's NRI plugin (no nvidia runtime).",
}
# The highest config version each containerd reads (version 4 came with containerd 2.3).
V4_SINCE = (2, 3)


@dataclass(frozen=True)
class Options:
    """What host data asks for; ``None`` keeps what the config files set."""

    binary: str = RUNTIME_BINARY
    systemd_cgroup: bool | None = None
    default_runtime: bool = False
    cdi_spec_dirs: tuple[str, ...] | None = None  # None: the files' value, else CDI_SPEC_DIRS
    dropin_dir: str = DROPIN_DIR
    dropin_path: str = OUR_DROPIN
    enable_cdi: bool | None = None  # None: the files' value, else on
    mode: str = CONTAINERD_MODE  # "runtime": register the nvidia runtime; "nri": NRI and CDI, no runtime
    enable_nri: bool | None = None  # NRI mode: None keeps a file's ``disable``, else NRI on
    config_root: str = CONFIG_ROOT  # where the config tree lives (``/etc/k0s`` on a k0s node)


@dataclass
class Plan:
    """What to write: config.toml's new text and the drop-in, and an account of why."""

    config_path: str
    config_text: str = ""
    dropin_path: str = OUR_DROPIN
    dropin_text: str = ""
    dropin_data: dict[str, Any] = field(default_factory=dict)
    intended: dict[str, Any] = field(default_factory=dict)
    # Values the user's files set that our files must keep: dotted key -> (file, value).
    user_set: dict[str, tuple[str, Any]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # files whose keys our drop-in carries
    # Keys our previous file carried from a file that no longer sets them: dotted key -> that file.
    dropped: dict[str, str] = field(default_factory=dict)
    dropped_lines: list[str] = field(default_factory=list)  # the same, for the plan
    # Our previous file records no source for the keys it carries (edited by hand).
    provenance_unknown: bool = False
    schema: int = 2
    # NRI mode: whether the merged config must have NRI on (None outside NRI mode), and the NRI
    # plugin's keys the user's files set: key -> (file, value), held by the gate like ``user_set``.
    nri_expected: bool | None = None
    nri_user_set: dict[str, tuple[str, Any]] = field(default_factory=dict)
    mode_line: str = ""  # what the plan says of the mode (NRI mode only)
    account: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Tables merge recursively, later scalars and lists replace earlier ones."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaf values by dotted path."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def without_zero_values(table: dict[str, Any]) -> dict[str, Any]:
    """The table less Go zero values ("" / false / 0 / empty), which mean the same as unset."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            value = without_zero_values(value)
        if value not in ("", False, 0, [], {}, None):
            out[key] = value
    return out


# Read once at import: the template ships as package data (checkout, editable install or wheel).
_TEMPLATE = Environment(
    undefined=StrictUndefined, keep_trailing_newline=True, trim_blocks=True, autoescape=False
).from_string(resources.files("pyinfra_gpunode.templates.containerd").joinpath("dropin.toml.j2").read_text())


IMPORTED = "Imported by name as the last entry of config.toml's imports"


def _render(
    data: dict[str, Any],
    account: list[str],
    carried: dict[str, str] | None = None,
    mode: str = CONTAINERD_MODE,
    imported: str = IMPORTED,
) -> str:
    body = tomlkit.dumps(_sorted(data))
    provenance = (
        []
        if carried is None
        else [PROVENANCE_HEAD]
        + [PROVENANCE + json.dumps({"file": path, "keys": keys}) for path, keys in _by_file(carried).items()]
    )
    text = _TEMPLATE.render(purpose=PURPOSE[mode], account=account, provenance=provenance, body=body, imported=imported)
    if node_toml.loads(text) != data:
        raise RuntimeError("rendered drop-in does not parse back to the intended configuration")
    return text


def carried_from(text: str | None) -> dict[str, str] | None:
    """The previous file's ``# carried-from`` lines: dotted CRI key -> the file it was carried from.

    Files written before these lines existed list the same in their account (``kept CRI keys
    of <file>: <keys>``), which is read instead. ``None`` where the text records neither (no
    file yet, or one edited by hand). A line that no longer parses as written is skipped: its
    keys count as of unknown source.
    """
    lines = (text or "").splitlines()
    found: dict[str, str] | None = {} if PROVENANCE_HEAD in lines else None
    for line in lines:
        earlier = _EARLIER.match(line)
        if earlier:  # an earlier version's account line lists the same, in load order
            found = found if found is not None else {}
            found.update(dict.fromkeys(earlier.group(2).split(", "), earlier.group(1)))
        if not line.startswith(PROVENANCE):
            continue
        found = found if found is not None else {}
        try:
            entry = node_json.loads(line[len(PROVENANCE) :])
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("file"), str)
            and isinstance(entry.get("keys"), list)
            and all(isinstance(key, str) for key in entry["keys"])
        ):
            found.update(dict.fromkeys(entry["keys"], entry["file"]))
    return found


def _by_file(keys: dict[str, str]) -> dict[str, list[str]]:
    """``{key: file}`` as ``{file: [keys, sorted]}``, files in order of their first key."""
    out: dict[str, list[str]] = {}
    for key, path in sorted(keys.items()):
        out.setdefault(path, []).append(key)
    return out


def _sorted(data: dict[str, Any]) -> dict[str, Any]:
    """``version`` first, then keys in byte order, tables recursively: byte-stable output."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: _sorted(v) for k, v in data.items() if isinstance(v, dict)}
    ordered = dict(sorted(scalars.items(), key=lambda kv: (kv[0] != "version", kv[0])))
    ordered.update(sorted(tables.items()))
    return ordered


def max_schema(version: ContainerdVersionInfo) -> int:
    """The highest config ``version`` this containerd reads: 2 on 1.x, 3 on 2.0 to 2.2, 4 from 2.3."""
    if version["major"] < 2:
        return 2
    return 4 if (version["major"], version["minor"]) >= V4_SINCE else 3


def migrates_each_file(version: ContainerdVersionInfo) -> bool:
    """Whether this containerd migrates every config file to its own version before merging it (2.3 and
    later: containerd/containerd cmd/containerd/server/config/config.go ``LoadConfigWithPlugins``, which
    warns "Configuration migrated from version N" per file), rather than migrating the merged tree by the
    version of the last file that sets one (2.0 to 2.2), where a file of another version can lose keys."""
    return (version["major"], version["minor"]) >= V4_SINCE


def _schema_errors(files: list[ConfigFile], version: ContainerdVersionInfo) -> list[str]:
    errors = []
    highest = max_schema(version)
    for config in files:
        if config["error"]:
            errors.append(f"{config['path']}: invalid TOML: {config['error']}")
        elif config["version"] == 1:
            errors.append(f"{config['path']}: key 'version' = 1 is not supported; use version = 2")
        elif config["version"] is not None and config["version"] > highest:
            needs = " (version 4 needs containerd 2.3 or later)" if config["version"] == 4 else ""
            errors.append(
                f"{config['path']}: key 'version' = {config['version']} is not supported "
                f"by containerd {version['major']}.{version['minor']} here{needs}"
            )
    return errors


def _runtime_plugin(schema: int) -> str:
    return CRI_V3_RUNTIME if schema >= 3 else CRI_V2


def _cri_table(config: ConfigFile, plugin: str) -> dict[str, Any]:
    table = parsed(config).get("plugins", {}).get(plugin, {})
    return table if isinstance(table, dict) else {}


def _table(data: Any, *keys: str) -> dict[str, Any]:
    """``data[k1][k2]…`` where each is a table, else an empty table (files are not trusted)."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def _merged(files: list[ConfigFile], plugin: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for config in files:
        merged = deep_merge(merged, _cri_table(config, plugin))
    return merged


def _has_unit(table: dict[str, Any], unit: str) -> bool:
    """Whether ``table`` has ``unit``: a top-level key, or ``containerd.<key>``, the parts containerd
    2.x migrates from a version-2 table one by one (each only where the version-3 table lacks it)."""
    head, _, rest = unit.partition(".")
    return head in table and (not rest or rest in _table(table, head))


def effective_runtime_table(files: list[ConfigFile], version: ContainerdVersionInfo, schema: int) -> dict[str, Any]:
    """The CRI runtime plugin's table as containerd reads the files (runtimes, default, CDI keys).

    1.x reads version-2 names; 2.x with a version 3 or 4 tree reads version-3 names (it drops
    version-2 ones); 2.x with a version 2 tree takes each key from the version-3 table where
    that has it, else migrates the version-2 key (``plugins/cri/runtime`` ConfigMigration).
    """
    if version["major"] < 2:
        return _merged(files, CRI_V2)
    v3 = _merged(files, CRI_V3_RUNTIME)
    if schema >= 3:
        return v3
    out = copy.deepcopy(v3)
    for key, value in _merged(files, CRI_V2).items():
        if key == "containerd" and isinstance(value, dict):
            containerd = out.setdefault("containerd", {})
            if isinstance(containerd, dict):
                for sub, sub_value in value.items():
                    containerd.setdefault(sub, copy.deepcopy(sub_value))
        else:
            out.setdefault(key, copy.deepcopy(value))
    return out


def _toml(value: Any) -> str:
    return tomlkit.item(value).as_string()


def _default_base(
    runtimes: dict[str, Any], default: str, builtin: dict[str, Any], user_set: dict[str, tuple[str, Any]]
) -> tuple[dict[str, Any], str]:
    """The runtime entry nvidia is copied from and why: the default runtime's (a file's entry, or
    containerd's own runc), or runc's where the default runtime does not run a runc shim."""
    entry = _table(runtimes, default) or (builtin if default == "runc" else {})
    setter = user_set.get("containerd.default_runtime_name")
    named = f"the default runtime, as {setter[0]} sets it" if setter else "the default runtime"
    if entry.get("runtime_type", RUNC_V2) in ("", RUNC_V2):
        return entry, f"copied from runtime {default} ({named})"
    runc = _table(runtimes, "runc") or builtin
    return runc, (
        f"copied from runtime runc: the default runtime {default} uses the shim "
        f"{entry.get('runtime_type')!r}, which does not run {RUNTIME}'s binary"
    )


# Runtime keys of containerd 1.x that 2.x no longer knows (it warns "Ignoring unknown key" for each).
V1_ONLY_RUNTIME_KEYS = ("runtime_engine", "runtime_root")


def _nvidia_runtime(
    runtimes: dict[str, Any],
    default: str,
    builtin: dict[str, Any],
    options: Options,
    user_set: dict[str, tuple[str, Any]],
    unknown: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The nvidia runtime: the default runtime's entry (``runtime_type``, every option,
    ``base_runtime_spec``, sandbox settings, ``privileged_without_host_devices``…) under what a
    file sets for nvidia itself; ``BinaryName`` ours, ``SystemdCgroup`` as asked, else as a file
    sets it for nvidia, else as the default runtime has it. ``user_set``: every key the files set;
    ``unknown``: keys of the copied entry the node's containerd does not know (not copied)."""
    base_entry, copied = _default_base(runtimes, default, builtin, user_set)
    left_out = sorted(key for key in unknown if key in base_entry)
    base = deep_merge({"runtime_type": RUNC_V2}, {k: v for k, v in base_entry.items() if k not in unknown})
    if left_out:
        copied += f" less {', '.join(left_out)} (this containerd does not know them)"
    base["options"] = _table(base, "options")
    runtime = deep_merge(base, _table(runtimes, RUNTIME))
    runtime["options"] = _table(runtime, "options")
    prefix = f"containerd.runtimes.{RUNTIME}.options."
    binary_setter = user_set.get(prefix + "BinaryName")
    cgroup_setter = user_set.get(prefix + "SystemdCgroup")
    if options.systemd_cgroup is not None:
        cgroup, why = options.systemd_cgroup, "set by gpunode_nvidia_systemd_cgroup"
        if cgroup_setter is not None and cgroup_setter[1] != cgroup:
            why += f"; {cgroup_setter[0]} sets {_toml(cgroup_setter[1])}"
    elif cgroup_setter is not None:
        cgroup, why = cgroup_setter[1], f"as {cgroup_setter[0]} sets it"
    else:
        cgroup, why = base["options"].get("SystemdCgroup", False), "as the runtime it was copied from has it"
    binary_why = ""
    if binary_setter is not None and binary_setter[1] != options.binary:
        binary_why = f" (gpunode_nvidia_runtime_binary; {binary_setter[0]} sets {_toml(binary_setter[1])})"
    runtime["options"]["BinaryName"] = options.binary
    runtime["options"]["SystemdCgroup"] = cgroup
    lines = [
        f"runtime {RUNTIME}: {copied}; BinaryName = {options.binary}{binary_why}, "
        f"SystemdCgroup = {str(cgroup).lower()} ({why})"
    ]
    for name, entry in sorted(runtimes.items()):
        binary = _table(entry, "options").get("BinaryName")
        if name != RUNTIME and isinstance(binary, str) and _is_toolkit_binary(binary, options.binary):
            lines.append(
                f"runtime {name} already runs {binary}: kept as it is; {RUNTIME} is added as the name "
                "the RuntimeClass handler uses"
            )
    return runtime, lines


def _is_toolkit_binary(binary: str, ours: str) -> bool:
    return binary == ours or posixpath.basename(binary) == posixpath.basename(ours)


def _user_values(files: list[ConfigFile], version: ContainerdVersionInfo, schema: int) -> dict[str, tuple[str, Any]]:
    """Every CRI key the files set (dotted, within its plugin table), with the file containerd takes it from.

    1.x reads version-2 names only; on 2.x a version-3 name wins over a version-2 one (see
    ``effective_runtime_table``), and a version 3 or 4 tree ignores version-2 names.
    """
    if version["major"] < 2:
        names: tuple[str, ...] = (CRI_V2,)
    else:
        names = (CRI_V3_RUNTIME, CRI_V3_IMAGES) if schema >= 3 else (CRI_V2, CRI_V3_RUNTIME, CRI_V3_IMAGES)
    values: dict[str, tuple[str, Any]] = {}
    for name in names:
        for config in files:
            values.update((key, (config["path"], value)) for key, value in flatten(_cri_table(config, name)).items())
    return values


def _explicit(options: Options) -> set[str]:
    """Keys our inputs set on purpose, whatever the files say (the gate does not hold them to the files)."""
    keys = {f"containerd.runtimes.{RUNTIME}.options.BinaryName"}
    if options.enable_cdi is not None:
        keys.add("enable_cdi")
    if options.cdi_spec_dirs is not None:
        keys.add("cdi_spec_dirs")
    if options.default_runtime:
        keys.add("containerd.default_runtime_name")
    if options.systemd_cgroup is not None:
        keys.add(f"containerd.runtimes.{RUNTIME}.options.SystemdCgroup")
    return keys


def cdi_keys(options: Options, user_set: dict[str, tuple[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """``enable_cdi`` and ``cdi_spec_dirs`` to write, and what they mean: a key a file sets is
    kept (not written) unless host data names another value; a key no file sets gets ours."""
    asked = {
        "enable_cdi": (options.enable_cdi, True, "gpunode_enable_cdi"),
        "cdi_spec_dirs": (
            None if options.cdi_spec_dirs is None else list(options.cdi_spec_dirs),
            list(CDI_SPEC_DIRS),
            "gpunode_cdi_spec_dirs",
        ),
    }
    out: dict[str, Any] = {}
    lines = []
    for key, (wanted, default, host_key) in asked.items():
        setter = user_set.get(key)
        if wanted is None and setter is not None:
            meaning = ""
            if key == "enable_cdi":
                meaning = "CDI stays on: " if setter[1] is True else "CDI stays off: "
            lines.append(f"{meaning}{setter[0]} sets {key} = {_toml(setter[1])}; kept")
            continue
        out[key] = default if wanted is None else wanted
        if wanted is None:
            lines.append(f"{key} = {_toml(out[key])} (no file sets it)")
        elif setter is not None and setter[1] != wanted:
            lines.append(f"{key} = {_toml(wanted)} ({host_key}); {setter[0]} sets {_toml(setter[1])}")
        else:
            lines.append(f"{key} = {_toml(wanted)} ({host_key})")
    return out, lines


@dataclass
class NriKeys:
    """The NRI plugin's table our file writes (``None``: none) and what it means."""

    table: dict[str, Any] | None
    lines: list[str]
    user_set: dict[str, tuple[str, Any]]  # NRI keys the files set: key -> (file, value)
    expected_on: bool  # whether the merged config has NRI on once our file is in place
    sources: list[str]  # files whose NRI keys the table carries (1.x)
    error: str | None = None


def nri_off_in_list(files: list[ConfigFile]) -> tuple[str, str] | None:
    """``(file, name)`` of the first file whose ``disabled_plugins`` names the NRI plugin, else ``None``."""
    for config in files:
        listed = parsed(config).get("disabled_plugins")
        for name in listed if isinstance(listed, list) else []:
            if name in NRI_NAMES:
                return config["path"], name
    return None


def nri_keys(files: list[ConfigFile], options: Options, carry: bool) -> NriKeys:
    """The NRI plugin as NRI mode needs it: ``disable = false`` where no file sets ``disable`` or host data
    asks (``gpunode_enable_nri``); a file's value is kept otherwise, and a file listing the plugin in
    ``disabled_plugins`` keeps it off. ``carry`` (containerd 1.x): the last file naming the plugin owns
    it, so the table carries every other file's NRI keys."""
    merged: dict[str, Any] = {}
    user_set: dict[str, tuple[str, Any]] = {}
    sources = []
    for config in files:
        table = _table(parsed(config), "plugins", NRI)
        if table:
            merged = deep_merge(merged, table)
            user_set.update((key, (config["path"], value)) for key, value in flatten(table).items())
            sources.append(config["path"])
    listed = nri_off_in_list(files)
    setter = user_set.get("disable")
    lines = []
    write = False
    if options.enable_nri:
        if listed:
            return NriKeys(
                None, [], user_set, False, sources,
                error=f"{listed[0]}: disabled_plugins names {listed[1]}, so NRI stays off whatever a drop-in says; "
                "remove it there (gpunode_enable_nri asks for NRI)",
            )  # fmt: skip
        write = True
        user_set.pop("disable", None)  # asked for by name: the gate does not hold it to the file
        other = f"; {setter[0]} sets {_toml(setter[1])}" if setter and setter[1] is not False else ""
        lines.append(f"NRI on: disable = false (gpunode_enable_nri){other}")
        expected_on = True
    elif listed:
        lines.append(f"NRI stays off: {listed[0]} names {listed[1]} in disabled_plugins; kept")
        expected_on = False
    elif setter is not None:
        expected_on = setter[1] is False
        state = "on" if expected_on else "off"
        asked = "" if expected_on else " (gpunode_enable_nri: true turns it on)"
        lines.append(f"NRI stays {state}: {setter[0]} sets disable = {_toml(setter[1])}; kept{asked}")
    else:
        write = True
        lines.append("NRI on: disable = false (no file sets it)")
        expected_on = True
    if carry:
        table = deep_merge(merged, {"disable": False}) if write else merged
        for path, keys in _by_file({key: value[0] for key, value in user_set.items()}).items():
            lines.append(f"NRI keys of {path} carried here: {', '.join(keys)}")
        return NriKeys(table or None, lines, user_set, expected_on, sources)
    return NriKeys({"disable": False} if write else None, lines, user_set, expected_on, [])


def _mode_line(cdi_on: bool, nri: NriKeys) -> str:
    if cdi_on and nri.expected_on:
        enabled = "NRI and CDI enabled"
    else:
        enabled = (
            f"{'NRI enabled' if nri.expected_on else 'NRI stays off'}, {'CDI enabled' if cdi_on else 'CDI stays off'}"
            " as the files set it"
        )
    return f"NRI mode: no nvidia runtime registered; {enabled}, for the GPU Operator's NRI plugin"


def _mode_errors(options: Options, version: ContainerdVersionInfo) -> list[str]:
    if options.mode not in MODES:
        return [f"mode must be one of {', '.join(MODES)}, got {options.mode!r}"]
    if options.mode != "nri":
        return []
    errors = []
    if (version["major"], version["minor"]) < NRI_SINCE:
        errors.append(
            f"containerd {version['raw']} has no NRI plugin (it came with containerd 1.7): "
            "gpunode_containerd_mode: nri needs containerd 1.7 or later"
        )
    if options.default_runtime:
        errors.append("NRI mode registers no runtime, so nvidia cannot be made the default runtime")
    return errors


def _input_errors(options: Options) -> list[str]:
    named = [("binary", options.binary), ("dropin_dir", options.dropin_dir)]
    named += [("cdi_spec_dirs entry", spec_dir) for spec_dir in options.cdi_spec_dirs or ()]
    # Shown as <U+000A>: a backslash escape would turn back into the character in a shell's echo.
    return [
        f"{name} '{without_controls(value)}' contains a newline or another control character; give a plain "
        "absolute path"
        for name, value in named
        if CONTROL.search(value)
    ]


def import_entries(options: Options) -> list[str]:
    return [f"{options.dropin_dir}/*.toml", options.dropin_path]


def edit_imports(text: str | None, schema: int, options: Options) -> str:
    """config.toml with ``imports`` covering the drop-in glob and ending with our drop-in.

    Edited with tomlkit so comments and layout are kept; an absent file is created.
    """
    glob, ours = import_entries(options)
    if text is None:
        doc = tomlkit.document()
        doc["version"] = schema
        doc["imports"] = [glob, ours]
        return tomlkit.dumps(doc)
    doc = tomlkit.parse(text)
    current = [str(item) for item in doc.get("imports", [])]
    wanted = [item for item in current if item != ours]
    if glob not in wanted:
        wanted.append(glob)
    wanted.append(ours)
    if wanted == current:
        return text
    if "imports" in doc:
        doc["imports"] = wanted
        return tomlkit.dumps(doc)
    # A new top-level key must come before the first table.
    imports_line = tomlkit.dumps({"imports": wanted})
    lines = text.splitlines(keepends=True)
    insert_at = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith("[")),
        len(lines),
    )
    if insert_at == len(lines) and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.insert(insert_at, imports_line)
    return "".join(lines)


def staged_imports(config_text: str, stage: str = "@GPUNODE_STAGE@", root: str = CONFIG_ROOT) -> str:
    """config.toml with every import under ``root`` (``/etc/containerd``) pointing into a staging copy."""
    doc = tomlkit.parse(config_text)
    doc["imports"] = [
        stage + str(entry) if str(entry).startswith(root + "/") else str(entry) for entry in doc.get("imports", [])
    ]
    return tomlkit.dumps(doc)


@by_content  # a fleet's nodes carry the same files: each tree planned once, every node its own copy
def plan(
    main_path: str,
    texts: dict[str, str],
    version: ContainerdVersionInfo,
    options: Options,
    runc_default: dict[str, Any] | None = None,
) -> Plan:
    """Decide config.toml's text and our drop-in for this node.

    ``texts`` holds every config file on the node (path → content). The drop-in is computed
    from the tree as it will be once config.toml imports the drop-in directory, without our
    own file, so it never depends on its previous content. ``runc_default`` is runc as the
    node's containerd defines it when no file does (from its ``config dump``). The drop-in
    carries config.toml's ``version`` (never the dump's: 2.x dumps print their own).
    """
    result = Plan(config_path=main_path, dropin_path=options.dropin_path)
    if (version["major"] == 1 and version["minor"] < 6) or version["major"] not in (1, 2):
        result.errors.append(f"containerd {version['raw']} is not supported (supported: 1.6, 1.7 and 2.x)")
        return result
    result.errors += _input_errors(options) + _mode_errors(options, version)
    if result.errors:
        return result
    main = resolve_tree(main_path, texts, options.config_root)["main"]
    if main is not None:
        disabled = [name for name in parsed(main).get("disabled_plugins") or [] if name in CRI_NAMES]
        if disabled:  # first: whatever else the file says, the kubelet has no CRI on this node
            result.errors.append(
                f"{main_path}: the CRI plugin is disabled (disabled_plugins names {', '.join(map(str, disabled))}), "
                "so containerd starts without a CRI and the kubelet can run no pod (Docker's containerd.io ships "
                "this file); remove it from disabled_plugins"
            )
        result.errors += _schema_errors([main], version)
        if main["version"] is None and not main["error"] and parsed(main):
            result.errors.append(
                f"{main_path}: key 'version' is missing, so containerd reads it as version 1; set version = 2"
            )
    if result.errors:
        return result

    # A new config.toml gets the version `containerd config default` prints: 2 on 1.x, 3 on 2.0-2.2, 4 from 2.3
    # (which migrates, and warns of, every version 2 or 3 file at each start).
    default_schema = max_schema(version)
    result.schema = main["version"] if main is not None and main["version"] else default_schema
    result.config_text = edit_imports(main["text"] if main else None, result.schema, options)
    # Our own file is resolved as empty: it must never feed its own content.
    tree = resolve_tree(
        main_path, {**texts, main_path: result.config_text, options.dropin_path: ""}, options.config_root
    )
    result.errors += tree["problems"]
    others = [config for config in load_order(tree) if config["path"] != options.dropin_path]
    result.errors += _schema_errors(others, version)
    if result.errors:
        return result
    # A drop-in newer than config.toml is for the node's own containerd to judge: v2.3.0-v2.3.4 refuse it (their
    # config dump fails, and the candidate check quotes it), 2.3.5+ and 2.4 migrate it on its own and merge.
    if not migrates_each_file(version):
        for config in others:
            if config["version"] and config["version"] != result.schema:
                result.warnings.append(
                    f"{config['path']}: version = {config['version']} differs from config.toml's "
                    f"version = {result.schema}; containerd may drop its settings"
                )
    runc = without_zero_values(runc_default or {}) or {"runtime_type": RUNC_V2}
    user_set = _user_values(others, version, result.schema)
    explicit = _explicit(options)
    result.user_set = {key: value for key, value in user_set.items() if key not in explicit}
    if version["major"] == 1:
        fill = {key: value for key, value in FILLED_IN.items() if key in (runc_default or {"runtime_type": ""})}
        _plan_full_cri(result, others, version, options, runc, fill, user_set, runc_default is not None)
        _drop_removed(result, texts, others, texts.get(options.dropin_path))
    else:
        _plan_owned_keys(result, others, version, options, runc, user_set)
    if not result.errors:
        _drop_own_runtime(result, options, texts.get(options.dropin_path))
    return result


def _cdi_on(owned: dict[str, Any], user_set: dict[str, tuple[str, Any]]) -> bool:
    """Whether ``enable_cdi`` is true once our file is in place: as written, else as a file sets it."""
    return owned.get("enable_cdi", user_set.get("enable_cdi", ("", True))[1]) is True


def _drop_own_runtime(result: Plan, options: Options, previous: str | None) -> None:
    """A switch of mode: in NRI mode, the nvidia runtime (and nvidia as default) our previous file
    registered itself, not carried from a file, goes; in runtime mode, the NRI plugin table it wrote.
    The plan says which; the gate lets the keys go (``dropped``)."""
    try:
        data = node_toml.loads(previous or "")
    except tomllib.TOMLDecodeError:
        return
    if options.mode == "runtime":
        if _table(data, "plugins", NRI):
            result.dropped_lines.append(
                f"dropped the NRI plugin settings of {options.dropin_path} (gpunode_containerd_mode: runtime): "
                "NRI is as the other files set it (off by default on containerd 1.7)"
            )
        return
    carried = carried_from(previous) or {}
    own: dict[str, Any] = {}
    for name in (CRI_V2, CRI_V3_RUNTIME):
        own.update(flatten(_table(data, "plugins", name)))
    prefix = f"containerd.runtimes.{RUNTIME}."
    gone = sorted(
        key
        for key, value in own.items()
        if (key.startswith(prefix) or (key == "containerd.default_runtime_name" and value == RUNTIME))
        and key not in carried
        and key not in result.intended
    )
    if not gone:
        return
    result.dropped.update(dict.fromkeys(gone, options.dropin_path))
    what = [f"runtime {RUNTIME}"] if any(key.startswith(prefix) for key in gone) else []
    what += [f"default_runtime_name = {_toml(RUNTIME)}"] if "containerd.default_runtime_name" in gone else []
    result.dropped_lines.append(
        f"dropped {' and '.join(what)} registered by {options.dropin_path}: NRI mode registers no runtime"
    )


def _default_line(user_set: dict[str, tuple[str, Any]]) -> str:
    setter = user_set.get("containerd.default_runtime_name")
    other = f"; {setter[0]} sets {_toml(setter[1])}" if setter and setter[1] != RUNTIME else ""
    return f"default runtime: {RUNTIME} (gpunode_nvidia_default_runtime){other}"


def _plan_full_cri(
    result: Plan,
    others: list[ConfigFile],
    version: ContainerdVersionInfo,
    options: Options,
    runc: dict[str, Any],
    fill: dict[str, str],
    user_set: dict[str, tuple[str, Any]],
    runc_loaded: bool,
) -> None:
    cri: dict[str, Any] = {}
    carried: dict[str, str] = {}
    for config in others:
        table = _cri_table(config, CRI_V2)
        if table:
            cri = deep_merge(cri, table)
            carried.update(dict.fromkeys(flatten(table), config["path"]))
            result.sources.append(config["path"])
    containerd = cri.setdefault("containerd", {})
    runtimes = containerd.setdefault("runtimes", {})
    default = containerd.get("default_runtime_name") or "runc"
    # The files' runtimes table replaces containerd's own (runc): runc is added only where the
    # merged config has it now (``runc_loaded``: the dump shows it; no file defines a runtime)
    # or the default runtime is runc.
    if "runc" not in runtimes and (default == "runc" or not runtimes or runc_loaded):
        why = "the CRI plugin needs its default runtime" if default == "runc" else "the merged config has it now"
        runtimes["runc"] = runc
        result.account.append(f"added runtime runc as containerd defines it ({why})")
    elif "runc" in runtimes:
        missing = {key: value for key, value in fill.items() if not runtimes["runc"].get(key)}
        if missing:
            runtimes["runc"] = {**missing, **runtimes["runc"]}
            result.account.append(
                "runtime runc: "
                + ", ".join(f"{key} = {value}" for key, value in missing.items())
                + " as containerd fills them in (no file sets them)"
            )
    if options.mode == "runtime":
        runtimes[RUNTIME], lines = _nvidia_runtime(runtimes, default, runc, options, user_set)
        result.account += lines
    if options.default_runtime:
        containerd["default_runtime_name"] = RUNTIME
        result.account.append(_default_line(user_set))
    default = containerd.get("default_runtime_name", "runc")
    if default not in runtimes:
        setter = next(
            (
                f["path"]
                for f in reversed(others)
                if "default_runtime_name" in _cri_table(f, CRI_V2).get("containerd", {})
            ),
            "config",
        )
        result.errors.append(f"{setter}: key 'default_runtime_name' = {default!r} names no runtime defined in any file")
        return
    owned: dict[str, Any] = {}
    if version["minor"] >= 7:
        owned, lines = cdi_keys(options, user_set)
        cri.update(owned)
        result.account += lines
    else:
        result.account.append("containerd 1.6 has no CDI switch; enable_cdi not written")
    plugins: dict[str, Any] = {CRI_V2: cri}
    if options.mode == "nri":
        nri = nri_keys(others, options, carry=True)
        if nri.error:
            result.errors.append(nri.error)
            return
        _nri_account(result, nri, _cdi_on(owned, user_set))
        result.sources += [path for path in nri.sources if path not in result.sources]
        if nri.table is not None:
            plugins[NRI] = nri.table
    result.account.append(
        "containerd 1.x: this file owns the whole CRI plugin and loads last; other files' CRI keys are carried here"
        + (" (and their NRI keys: it owns the NRI plugin too)" if NRI in plugins else "")
    )
    result.dropin_data = {"version": 2, "plugins": plugins}
    result.intended = flatten(cri)
    result.dropin_text = _render(result.dropin_data, result.account, carried, options.mode)


def _nri_account(result: Plan, nri: NriKeys, cdi_on: bool) -> None:
    result.nri_expected = nri.expected_on
    result.nri_user_set = nri.user_set
    result.mode_line = _mode_line(cdi_on, nri)
    result.account += nri.lines
    result.account.insert(0, result.mode_line)


def _drop_removed(result: Plan, texts: dict[str, str], others: list[ConfigFile], previous: str | None) -> None:
    """Keys our previous file carried from a file that no longer sets them leave as the user's intent."""
    sources = carried_from(previous)
    if sources is None:
        result.provenance_unknown = bool(previous and previous.strip())
        return
    present = {config["path"] for config in others}
    result.dropped = {key: path for key, path in sources.items() if key not in result.intended}
    for path, keys in _by_file(result.dropped).items():
        why = (
            "which was removed"
            if path not in texts
            else "which is no longer imported"
            if path not in present
            else "which no longer sets them"
        )
        result.dropped_lines.append(f"dropped {', '.join(keys)} carried from {path}, {why}")


def _plan_owned_keys(
    result: Plan,
    others: list[ConfigFile],
    version: ContainerdVersionInfo,
    options: Options,
    runc: dict[str, Any],
    user_set: dict[str, tuple[str, Any]],
) -> None:
    for config in others:
        for name in (CRI_V2, CRI_V3_RUNTIME, CRI_V3_IMAGES):
            result.intended.update(flatten(_cri_table(config, name)))
    effective = effective_runtime_table(others, version, result.schema)
    runtimes = _table(effective, "containerd", "runtimes")
    default = _table(effective, "containerd").get("default_runtime_name") or "runc"
    if default not in runtimes and default not in (("runc", RUNTIME) if options.mode == "runtime" else ("runc",)):
        setter = user_set.get("containerd.default_runtime_name", ("config",))[0]
        result.errors.append(f"{setter}: key 'default_runtime_name' = {default!r} names no runtime defined in any file")
        return
    result.sources = [
        config["path"]
        for config in others
        if any(
            {default, RUNTIME} & set(_table(_cri_table(config, name), "containerd", "runtimes"))
            for name in (CRI_V2, CRI_V3_RUNTIME)
        )
    ]
    cdi, cdi_lines = cdi_keys(options, user_set)
    units: dict[str, Any] = dict(cdi)
    if options.mode == "runtime":
        nvidia, lines = _nvidia_runtime(runtimes, default, runc, options, user_set, V1_ONLY_RUNTIME_KEYS)
        result.account += lines
        units["containerd.runtimes"] = {RUNTIME: nvidia}
    else:
        result.sources = []  # nothing is copied from another file
    result.account += cdi_lines
    if options.default_runtime:
        units["containerd.default_runtime_name"] = RUNTIME
        result.account.append(_default_line(user_set))
    v3 = _merged(others, CRI_V3_RUNTIME)
    plugins: dict[str, Any] = {}
    for unit, value in units.items():
        # A version 2 tree on 2.x: a key of a version-3 table wins over the version-2 one.
        name = CRI_V3_RUNTIME if result.schema >= 3 or _has_unit(v3, unit) else CRI_V2
        head, _, sub = unit.partition(".")
        target = plugins.setdefault(name, {})
        if sub:
            target.setdefault(head, {})[sub] = value
        else:
            target[head] = value
        result.intended.update(flatten({head: {sub: value} if sub else value}))
    if options.mode == "nri":
        nri = nri_keys(others, options, carry=False)
        if nri.error:
            result.errors.append(nri.error)
            return
        _nri_account(result, nri, _cdi_on(cdi, user_set))
        if nri.table is not None:
            plugins[NRI] = nri.table
    where = " and ".join(
        f"{name} ({', '.join(sorted(table))})" if len(plugins) > 1 else name for name, table in sorted(plugins.items())
    )
    result.account.append(
        f"containerd 2.x deep-merges: only the keys above, version = {result.schema} as config.toml, "
        + (f"plugin {where}" if plugins else "no key to write")
    )
    result.dropin_data = {"version": result.schema, **({"plugins": plugins} if plugins else {})}
    imported = IMPORTED if options.dropin_path == OUR_DROPIN else f"Imported through {options.dropin_dir}/*.toml"
    result.dropin_text = _render(result.dropin_data, result.account, mode=options.mode, imported=imported)
