"""Read ``containerd config dump`` and the CRI plugin's start log; judge a candidate (no I/O).

The 1.x dump uses ``io.containerd.grpc.v1.cri``; the 2.x dump always says ``version = 3``
and uses ``io.containerd.cri.v1.runtime`` and ``io.containerd.cri.v1.images``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from typing import Any, TypedDict

from pyinfra_gpunode import node_json, node_toml
from pyinfra_gpunode.containerd_dropin import (
    CRI_V2,
    CRI_V3_IMAGES,
    CRI_V3_RUNTIME,
    FILLED_IN,
    NRI,
    NRI_NAMES,
    RUNTIME,
    flatten,
)
from pyinfra_gpunode.memo import by_content
from pyinfra_gpunode.redaction import is_secret as is_secret  # redaction's home is pyinfra_gpunode.redaction
from pyinfra_gpunode.redaction import redacted as redacted
from pyinfra_gpunode.redaction import shown


class RuntimeInfo(TypedDict):
    runtime_type: str | None
    BinaryName: str | None
    SystemdCgroup: bool | None


class DumpSummary(TypedDict):
    dump_version: int | None
    runtimes: dict[str, RuntimeInfo]
    default_runtime_name: str | None
    default_runtime_present: bool
    enable_cdi: bool | None
    cdi_spec_dirs: list[str] | None
    registry_config_path: str | None


def cri_tables(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The CRI plugin tables of a dump, keyed by plugin name."""
    plugins = dump.get("plugins", {})
    names = (CRI_V3_RUNTIME, CRI_V3_IMAGES) if dump.get("version", 0) >= 3 else (CRI_V2,)
    return {name: plugins.get(name, {}) for name in names}


@by_content(shared=True)  # every node of a fleet whose configs are alike dumps the same text: one, read-only
def parsed_dump(text: str) -> dict[str, Any]:
    """``containerd config dump``'s ``text`` parsed within ``node_toml``'s limits, its keys shared
    (``with_shared_keys``), read-only (``memo.read_only``: the nodes that dumped the same text share it);
    raises ``tomllib.TOMLDecodeError`` where it is no TOML or beyond the limits."""
    parsed: dict[str, Any] = with_shared_keys(node_toml.parsed_within_limits(text))  # kept here, not twice
    return parsed


def with_shared_keys(data: Any) -> Any:
    """Parsed TOML ``data`` with every table key interned, values as they are: every node's dump has
    containerd's same few hundred keys, which a run over many nodes then holds once, not once a node."""
    if isinstance(data, dict):
        return {sys.intern(key): with_shared_keys(value) for key, value in data.items()}
    if isinstance(data, list):
        return [with_shared_keys(item) for item in data]
    return data


def runc_runtime(dump: dict[str, Any]) -> dict[str, Any] | None:
    """runc's table in a dump (the binary's defaults where no file defines runc)."""
    tables = cri_tables(dump)
    runtime_table = tables.get(CRI_V3_RUNTIME) or tables.get(CRI_V2) or {}
    runc = runtime_table.get("containerd", {}).get("runtimes", {}).get("runc")
    return runc if isinstance(runc, dict) else None


def summarize(dump: dict[str, Any]) -> DumpSummary:
    tables = cri_tables(dump)
    runtime_table = tables.get(CRI_V3_RUNTIME) or tables.get(CRI_V2) or {}
    images_table = tables.get(CRI_V3_IMAGES) or tables.get(CRI_V2) or {}
    containerd = runtime_table.get("containerd", {})
    runtimes = {
        name: {
            "runtime_type": table.get("runtime_type"),
            "BinaryName": table.get("options", {}).get("BinaryName"),
            "SystemdCgroup": table.get("options", {}).get("SystemdCgroup"),
        }
        for name, table in sorted(containerd.get("runtimes", {}).items())
    }
    default = containerd.get("default_runtime_name")
    return {
        "dump_version": dump.get("version"),
        "runtimes": runtimes,  # type: ignore[typeddict-item]
        "default_runtime_name": default,
        "default_runtime_present": default in runtimes,
        "enable_cdi": runtime_table.get("enable_cdi"),
        "cdi_spec_dirs": runtime_table.get("cdi_spec_dirs"),
        "registry_config_path": images_table.get("registry", {}).get("config_path"),
    }


def nri_state(dump: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether a dump has containerd's NRI plugin on, and why not: ``(None, …)`` where the dump has no
    NRI plugin (containerd 1.6), ``(False, why)`` where ``disable = true`` or ``disabled_plugins`` names it."""
    table = dump.get("plugins", {}).get(NRI)
    if not isinstance(table, dict):
        return None, f"containerd's config has no {NRI} plugin (NRI came with containerd 1.7)"
    listed = [name for name in dump.get("disabled_plugins") or [] if name in NRI_NAMES]
    if listed:
        return False, f"disabled_plugins names {listed[0]}"
    if table.get("disable") is True:
        return False, f"plugins.{NRI}.disable = true"
    return True, ""


# Go durations containerd prints in its own form ("5s" for "5000ms"): not compared with a file's text.
NRI_DURATIONS = ("plugin_registration_timeout", "plugin_request_timeout")


def nri_losses(after: dict[str, Any], expected_on: bool | None, user_set: dict[str, tuple[str, Any]]) -> list[str]:
    """What the candidate config (``after``, NRI mode) lacks: NRI on where ``expected_on`` (``None``: not NRI
    mode), and every NRI key a user's file sets (``user_set``) with the file's value."""
    if expected_on is None:
        return []
    losses = []
    on, why = nri_state(after)
    if expected_on and not on:
        losses.append(f"NRI would stay off in the merged config: {why}")
    table = flatten(after.get("plugins", {}).get(NRI) or {})
    for key, (path, value) in sorted(user_set.items()):
        now = table.get(key, _UNSET)
        if key not in NRI_DURATIONS and now != value:
            shown_now = "<unset>" if now is _UNSET else shown(key, now)
            losses.append(f"{NRI}:{key} is set to {shown(key, value)} in {path}; the candidate makes it {shown_now}")
    return losses


def normal_value(key: str, value: Any) -> Any:
    """A runtime's empty ``runtime_type``/``sandbox_mode`` as the default containerd fills in."""
    if key.startswith("containerd.runtimes.") and value == "":
        return FILLED_IN.get(key.rpartition(".")[2], value)
    return value


def _cri_leaves(dump: dict[str, Any]) -> dict[str, Any]:
    return {
        f"{plugin}:{key}": value for plugin, table in cri_tables(dump).items() for key, value in flatten(table).items()
    }


_UNSET = object()


def candidate_losses(
    before: dict[str, Any],
    after: dict[str, Any],
    before_warnings: list[str],
    after_warnings: list[str],
    intended: dict[str, Any],
    binary: str,
    user_set: dict[str, tuple[str, Any]] | None = None,
    dropped: dict[str, str] | None = None,
    runtime_expected: bool = True,
) -> list[str]:
    """What the candidate config would lose or break, compared with the current dump.

    A CRI key that changes (or appears) and that a user's file sets (``user_set``: dotted key
    within a CRI plugin table, e.g. ``registry.config_path`` -> (file, value)) must take the
    file's value; any other key may change only to the value our files set for it
    (``intended``). A runtime's empty ``runtime_type``/``sandbox_mode`` counts as the default
    containerd fills in. Every runtime present before must stay, the default runtime must be
    defined, and no new warning may appear. Credential values are not shown.

    ``dropped`` (dotted key -> file) holds the keys our previous file carried from a file that
    no longer sets them: the user removed them, so they may change or go, and a runtime they
    defined may go with every key under it. ``runtime_expected`` false (NRI mode): the candidate
    need not have the nvidia runtime.
    """
    losses = []
    user_set, dropped = user_set or {}, dropped or {}
    summary_before, summary_after = summarize(before), summarize(after)
    runtimes = summary_after["runtimes"]
    removed = [
        f"containerd.runtimes.{name}."
        for name in summary_before["runtimes"]
        if name not in runtimes and any(key.startswith(f"containerd.runtimes.{name}.") for key in dropped)
    ]
    if runtime_expected and RUNTIME not in runtimes:
        losses.append(f"runtime {RUNTIME} is missing from the merged config")
    elif runtime_expected and runtimes[RUNTIME]["BinaryName"] != binary:
        losses.append(f"runtime {RUNTIME} has BinaryName {runtimes[RUNTIME]['BinaryName']!r}, not {binary!r}")
    for name in summary_before["runtimes"]:
        if name not in runtimes and f"containerd.runtimes.{name}." not in removed:
            losses.append(f"runtime {name} would be lost")
    default = summary_after["default_runtime_name"] or "runc"
    if default not in runtimes:
        losses.append(f"default runtime {default!r} is not defined")
    old, new = _cri_leaves(before), _cri_leaves(after)
    for key in sorted(set(old) | set(new)):
        rest = key.partition(":")[2]
        was, now = old.get(key, _UNSET), new.get(key, _UNSET)
        if was is not _UNSET and normal_value(rest, was) == normal_value(rest, now):
            continue
        if rest in dropped or rest.startswith(tuple(removed)):
            continue
        if rest in user_set:
            path, value = user_set[rest]
            if normal_value(rest, now) != normal_value(rest, value):
                shown_now = "<unset>" if now is _UNSET else shown(rest, now)
                losses.append(f"{key} is set to {shown(rest, value)} in {path}; the candidate makes it {shown_now}")
            continue
        if was is _UNSET:
            continue  # a key that appears: our own, or a default of something our files add
        if now is _UNSET and was in ("", False, 0, [], None):
            continue  # an unset key is Go's zero value
        if rest in intended and normal_value(rest, intended[rest]) == normal_value(rest, now):
            continue
        shown_now = "<unset>" if now is _UNSET else shown(rest, now)
        losses.append(f"{key} would change from {shown(rest, was)} to {shown_now}")
    losses += [f"new warning: {warning}" for warning in new_warnings(before_warnings, after_warnings)]
    return losses


# Fields containerd stamps on a log line that differ from run to run: its time, the time a step took
# (containerd 2.3+'s migration warning: t="7.09µs"), a duration or a process id; and the row and column of
# a key in a file, which move when a line is added above it (our imports line in config.toml).
_VOLATILE = re.compile(r'(?:^|\s)(?:time|t|duration|elapsed|pid|row|column)=(?:"(?:[^"\\]|\\.)*"|\S*)')
# containerd 2.3+ warns once for every file whose version is below 4 (containerd's own migration, which
# 2.0-2.2 did silently): what the node's files say, not something a candidate breaks.
_MIGRATED = re.compile(r'msg="Configuration migrated from version [0-9]+, ')


def warning_text(line: str) -> str:
    """A warning line of containerd's stderr without its volatile fields: the same warning read at two
    moments, or from two runs of the binary, is one text."""
    return _VOLATILE.sub("", line).strip()


def expected_warning(text: str) -> bool:
    """Whether a warning is containerd's notice of its own config migration (containerd 2.3+, for every
    version 2 or 3 file it loads), which no file of ours causes or can remove."""
    return _MIGRATED.search(text) is not None


def new_warnings(before: list[str], after: list[str]) -> list[str]:
    """The warnings of a candidate tree (``after``) that the current tree (``before``) does not produce,
    compared without volatile fields, less containerd's migration notices."""
    seen = {warning_text(line) for line in before}
    found = []
    for line in after:
        text = warning_text(line)
        if text not in seen and not expected_warning(text) and text not in found:
            found.append(text)
    return found


_CRI_FAILED = re.compile(r'failed to load plugin io\.containerd\.(?:grpc\.v1\.cri|cri[.\w]*)" error="(.*)"')
# 2.x: msg="failed to load plugin" error="…" id=io.containerd.grpc.v1.cri (or a cri.v1 plugin it needs)
_CRI_FAILED_2X = re.compile(
    r'msg="failed to load plugin" error="((?:[^"\\]|\\.)*)" id=io\.containerd\.(?:grpc\.v1\.cri|cri\.v1\.\w+)(?: |$)'
)
_JSON_CONFIG = re.compile(r'msg="starting cri plugin" config="((?:[^"\\]|\\.)*)"')


class CriLoaded(TypedDict):
    loaded: bool
    runtimes: list[str]
    default_runtime_name: str | None
    enable_cdi: bool | None
    registry_config_path: str | None
    error: str | None
    source: str  # how it was read: JOURNAL, CTR or "" (nothing found)


JOURNAL = "the CRI plugin's start line in the journal"
CTR = "ctr plugins ls (CRI plugin status only: no CRI start line at this log level)"


def _go_map_keys(text: str, start: int) -> list[str]:
    """Top-level keys of a Go ``%+v`` map printed from ``start`` (just after ``map[``)."""
    keys = []
    depth = 0
    token = ""
    for char in text[start:]:
        if depth == 0 and char == "]":
            break
        if char in "{[":
            if depth == 0 and token.endswith(":"):
                keys.append(token[:-1].strip())
            depth += 1
            token = ""
        elif char in "}]":
            depth -= 1
            token = ""
        elif depth == 0:
            token = "" if char == " " else token + char
    return keys


def _go_field(text: str, name: str) -> str | None:
    match = re.search(rf"\b{name}:([^\s}}]*)", text)
    return match.group(1) if match else None


def _cri_loaded(
    loaded: bool,
    runtimes: list[str] | None = None,
    default_runtime_name: str | None = None,
    enable_cdi: bool | None = None,
    registry_config_path: str | None = None,
    error: str | None = None,
    source: str = JOURNAL,
) -> CriLoaded:
    return {
        "loaded": loaded,
        "runtimes": sorted(runtimes or []),
        "default_runtime_name": default_runtime_name,
        "enable_cdi": enable_cdi,
        "registry_config_path": registry_config_path,
        "error": error,
        "source": source,
    }


def _table(value: Any) -> dict[str, Any]:
    """``value`` where it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _parse_cri_line(line: str) -> CriLoaded | None:
    failed = _CRI_FAILED.search(line) or _CRI_FAILED_2X.search(line)
    if failed:
        return _cri_loaded(False, error=failed.group(1).replace('\\"', '"'))
    json_config = _JSON_CONFIG.search(line)
    if json_config:
        try:  # the node's journal line: any JSON at all, or none
            config = node_json.loads(json_config.group(1).encode().decode("unicode_escape"))
        except ValueError:
            return None
        config = _table(config)
        containerd = _table(config.get("containerd"))
        runtimes = _table(containerd.get("runtimes"))
        default, cdi = containerd.get("defaultRuntimeName"), config.get("enableCDI")
        return _cri_loaded(
            True,
            runtimes=[str(name) for name in runtimes],
            default_runtime_name=default if isinstance(default, str) else None,
            enable_cdi=cdi if isinstance(cdi, bool) else None,
        )
    if "Start cri plugin with config" in line:
        marker = line.find("Runtimes:map[")
        cdi = _go_field(line, "EnableCDI")
        return _cri_loaded(
            True,
            runtimes=_go_map_keys(line, marker + len("Runtimes:map[")) if marker >= 0 else [],
            default_runtime_name=_go_field(line, "DefaultRuntimeName"),
            enable_cdi=None if cdi is None else cdi == "true",
            registry_config_path=_go_field(line, "ConfigPath") or None,
        )
    return None


def parse_cri_start_log(lines: list[str]) -> CriLoaded:
    """What the running daemon's CRI plugin loaded, from its last start (or failure) log line."""
    result = _cri_loaded(False, source="")
    for line in lines:
        result = _parse_cri_line(line) or result
    return result


_CTR_CRI = re.compile(r"^io\.containerd\.(?:grpc\.v1\s+cri|cri\.v1\s+\w+)\s+\S+\s+(\w+)\s*$")


def parse_cri_loaded(journal: list[str], ctr: list[str]) -> CriLoaded:
    """
    What the running daemon's CRI plugin loaded: from its start line in the journal where there
    is one, else (containerd logging above info, or elsewhere) from ``ctr plugins ls``, which
    gives the CRI plugins' status (``ok``/``error``) but not the runtimes they loaded.
    ``ctr`` holds the CRI rows of ``ctr plugins ls`` and any ``Message:`` of a plugin error.
    """
    logged = parse_cri_start_log(journal)
    if logged["source"]:
        return logged
    statuses = [match.group(1) for match in map(_CTR_CRI.match, ctr) if match]
    if not statuses:
        return logged
    if any(status != "ok" for status in statuses):
        messages = [line.strip().removeprefix("Message:").strip() for line in ctr if "Message:" in line]
        detail = "; ".join(messages) or f"CRI plugin status {', '.join(statuses)}"
        return _cri_loaded(False, error=f"ctr plugins ls: {detail}", source=CTR)
    return _cri_loaded(True, source=CTR)


def expected_after_restart(
    summary: DumpSummary, previous: CriLoaded, dropped: Collection[str] = (), runtime_expected: bool = True
) -> CriLoaded:
    """What a daemon restarted on the current files must load: the dump's runtimes (nvidia among them,
    unless ``runtime_expected`` is false: NRI mode), default runtime and registry path, plus every
    runtime the previous daemon had, less those whose file the user removed (``dropped``, as the
    write's gate accepted it)."""
    ours = {RUNTIME} if runtime_expected else set()
    runtimes = sorted({*ours, *summary["runtimes"], *(set(previous["runtimes"]) - set(dropped))})
    return _cri_loaded(
        True,
        runtimes=runtimes,
        default_runtime_name=summary["default_runtime_name"],
        enable_cdi=None,
        registry_config_path=summary["registry_config_path"],
        source="the config dump and the previous daemon",
    )


def restart_problem(active_state: str, result: str, loaded: CriLoaded, expected: CriLoaded) -> str | None:
    """
    Why a restarted daemon is not what ``expected`` describes, or ``None``: the unit is active,
    its CRI plugin loaded every expected runtime, the same default runtime and (where the daemon
    logs it: 1.x) the same registry ``config_path``. ``result`` is the unit's ``Result``;
    ``start-limit-hit`` means systemd refuses starts until ``systemctl reset-failed``.
    Read through ``ctr`` (no start line in the journal), only the CRI plugin's status is known.
    """
    if active_state != "active":
        return f"the unit is {active_state or 'unknown'} (result {result or 'unknown'})"
    if not loaded["loaded"]:
        return f"the CRI plugin did not load: {loaded['error'] or 'no start line and no answer from ctr'}"
    if loaded["source"] == CTR:
        return None
    missing = sorted(set(expected["runtimes"]) - set(loaded["runtimes"]))
    if missing:
        return f"the CRI plugin lacks runtimes {', '.join(missing)}"
    default = expected["default_runtime_name"]
    if default and loaded["default_runtime_name"] != default:
        return f"the default runtime is {loaded['default_runtime_name']!r}, expected {default!r}"
    path = loaded["registry_config_path"]
    if path is not None and expected["registry_config_path"] and path != expected["registry_config_path"]:
        return f"the registry config_path is {path!r}, expected {expected['registry_config_path']!r}"
    return None
