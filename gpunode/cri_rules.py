"""Judge a merged containerd config by the CRI plugin's own start rules (no I/O).

``containerd config dump`` merges the files but runs none of the CRI plugin's checks: a config
the dump prints can still keep the CRI plugin from starting (and, with ``required_plugins``
naming it, stop the whole daemon). The rules below are the plugin's own (containerd 1.6/1.7
``pkg/cri/config``, 2.x ``internal/cri/config``), applied to the dump; the files, in load
order, say where each key comes from. One rule comes before the dump: an ``imports`` entry naming a
file that does not exist makes containerd itself exit at start (1.6 and 1.7 fail ``config dump`` on it
too; 2.x's dump prints what it merged before that file and no error).

Each rule that keeps the CRI plugin (or containerd) from starting is in ``START_RULES`` with the containerd
lines that make its check (``since``/``until``) and containerd's own error text; given the node's version,
a rule is applied only where that version makes the check. Each range was read from containerd's source
and run on real daemons (tests/integration/test_cri_start_rules.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra_gpunode.containerd_dropin import CRI_NAMES, CRI_V2, CRI_V3_IMAGES, CRI_V3_RUNTIME, OUR_DROPIN, RUNC_V2
from pyinfra_gpunode.containerd_files import (
    MISSING_IMPORT_EFFECT,
    ConfigFile,
    MissingImport,
    missing_import_text,
    parsed,
)
from pyinfra_gpunode.go_duration import parsed_duration
from pyinfra_gpunode.versions import ContainerdVersionInfo

CRI_PLUGINS = (CRI_V2, CRI_V3_RUNTIME, CRI_V3_IMAGES)
# containerd 2.x's own cni.bin_dirs (upstream; Debian's build), which it drops where bin_dir is set.
DEFAULT_BIN_DIRS = (["/opt/cni/bin"], ["/usr/lib/cni", "/opt/cni/bin"])


@dataclass(frozen=True)
class Finding:
    """One rule the merged config breaks."""

    message: str
    stops_cri: bool  # the CRI plugin refuses to start; else it starts, but not as the files say


@dataclass(frozen=True)
class StartRule:
    """A check containerd makes as it starts, made by the lines (major, minor) from ``since`` up to, not
    including, ``until``; ``None`` leaves that end open (every line gpunode supports, 1.6 on)."""

    error: str  # containerd's own text ("{}" where it quotes a value; "" where it logs none)
    since: tuple[int, int] | None = None
    until: tuple[int, int] | None = None

    def holds(self, version: ContainerdVersionInfo | None) -> bool:
        """Whether containerd ``version`` makes this check; with no version known, every rule holds."""
        if version is None:
            return True
        line = (version["major"], version["minor"])
        return (self.since is None or line >= self.since) and (self.until is None or line < self.until)


# Every rule that stops the CRI plugin (or containerd), with the lines that make its check (containerd's
# pkg/cri/config ValidatePluginConfig on 1.6 and 1.7; internal/cri/config ValidateImageConfig,
# ValidateRuntimeConfig and ValidateServerConfig on 2.x). 1.x returns the first error only, so a tree
# breaking two rules shows one in containerd's log; on 2.x the images, runtime and server checks are
# separate plugins. Run on 1.6.20, 1.7.24, 2.1.9, 2.3.4 and 2.4.0-dev where the line has the key, unless
# said otherwise.
START_RULES = {
    # containerd exits before any plugin loads (run on 1.6.20, 1.7.24 and 2.1.9).
    "missing import": StartRule("open {}: no such file or directory"),
    # containerd loads no CRI plugin at all, and says nothing of it.
    "disabled": StartRule(""),
    # 2.0 dropped untrusted_workload_runtime: 2.x ignores the key (its dump drops it) and starts.
    "untrusted_workload_runtime": StartRule(
        'conflicting definitions: configuration includes both `untrusted_workload_runtime` and `runtimes["untrusted"]`',
        until=(2, 0),
    ),
    "default runtime empty": StartRule("`default_runtime_name` is empty"),
    "default runtime undefined": StartRule(
        'no corresponding runtime configured in `containerd.runtimes` for `containerd` `default_runtime_name = "{}"'
    ),
    "mirrors with config_path": StartRule("`mirrors` cannot be set when `config_path` is provided"),
    # 2.0 dropped registry.configs.<host>.tls with the check: 2.x ignores the key (its dump drops it) and starts.
    "tls with config_path": StartRule("`configs.tls` cannot be set when `config_path` is provided", until=(2, 0)),
    # bin_dirs came with 2.1 (v2.1.0's source; 1.x ignores the key, as 2.0's source says 2.0 does).
    "cni bin_dir and bin_dirs": StartRule(
        "`cni.bin_dir` and `cni.bin_dirs` cannot be set at the same time", since=(2, 1)
    ),
    "stream_idle_timeout": StartRule("invalid stream idle timeout: {}"),
    # The whole daemon exits where a stopped CRI plugin is required (run on 2.1.9).
    "required_plugins": StartRule("load required plugin {}"),
}


def _holds(rule: str, version: ContainerdVersionInfo | None) -> bool:
    return START_RULES[rule].holds(version)


def _says(rule: str, *values: str) -> str:
    """containerd's error text of ``rule`` (``values`` where it quotes them), quoted for a message."""
    return f'("{START_RULES[rule].error.format(*values)}")'


def _tables(dump: dict[str, Any]) -> tuple[str, dict[str, Any], str, dict[str, Any]]:
    """The runtime and images plugin names and tables of a dump (1.x: both the one CRI plugin)."""
    plugins = dump.get("plugins", {})
    runtime, images = (CRI_V3_RUNTIME, CRI_V3_IMAGES) if dump.get("version", 0) >= 3 else (CRI_V2, CRI_V2)
    return runtime, plugins.get(runtime) or {}, images, plugins.get(images) or {}


def _value(table: dict[str, Any], path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(table, dict):
            return None
        table = table.get(part)  # type: ignore[assignment]
    return table


def _setters(dump: dict[str, Any], files: list[ConfigFile], path: Sequence[str], empty: bool = False) -> list[str]:
    """The files that set ``path`` (within a CRI plugin table, any schema's name) as the merge keeps it,
    to a value that is not empty (with ``empty``, to any value): on 1.x only the last file with a CRI
    table counts (it owns the whole plugin) unless that is our drop-in, which carries every file's CRI
    keys; on 2.x every file."""
    unset: tuple[Any, ...] = (None,) if empty else (None, "", [], {})
    cri_files = [(config, parsed(config).get("plugins", {})) for config in files]
    cri_files = [(config, plugins) for config, plugins in cri_files if isinstance(plugins, dict)]
    if dump.get("version", 0) < 3:
        owners = [item for item in cri_files if isinstance(item[1].get(CRI_V2), dict)]
        cri_files = cri_files if owners and owners[-1][0]["path"] == OUR_DROPIN else owners[-1:]
    return [
        config["path"]
        for config, plugins in cri_files
        if any(_value(plugins.get(name) or {}, path) not in unset for name in CRI_PLUGINS)
    ]


def _top_setters(files: list[ConfigFile], key: str, names: Sequence[str]) -> list[str]:
    """The files whose top-level ``key`` (a list of plugin names) names one of ``names``."""
    found = []
    for config in files:
        value = parsed(config).get(key)
        if isinstance(value, list) and set(names) & set(value):
            found.append(config["path"])
    return found


def _where(paths: list[str], default: str = "containerd's built-in default") -> str:
    return ", ".join(paths) if paths else default


def _disabled(dump: dict[str, Any], files: list[ConfigFile], version: ContainerdVersionInfo | None) -> list[Finding]:
    names = [name for name in dump.get("disabled_plugins") or [] if name in CRI_NAMES]
    if not names or not _holds("disabled", version):
        return []
    return [
        Finding(
            f"the CRI plugin is disabled: disabled_plugins names {', '.join(names)} "
            f"(in {_where(_top_setters(files, 'disabled_plugins', names), 'a file')}), so containerd starts "
            "without a CRI and the kubelet can run no pod; remove it from disabled_plugins",
            stops_cri=True,
        )
    ]


def _registry(dump: dict[str, Any], files: list[ConfigFile], version: ContainerdVersionInfo | None) -> list[Finding]:
    _runtime, _table, images, table = _tables(dump)
    registry = table.get("registry") or {}
    config_path = registry.get("config_path")
    if not config_path:
        return []
    key = f'plugins."{images}".registry'
    where_path = _where(_setters(dump, files, ("registry", "config_path")))
    findings = []
    mirrors = registry.get("mirrors") or {}
    if mirrors and _holds("mirrors with config_path", version):
        findings.append(
            Finding(
                f"{key}.mirrors ({', '.join(sorted(mirrors))}; in "
                f"{_where(_setters(dump, files, ('registry', 'mirrors')))}) cannot be set when "
                f"{key}.config_path = {config_path!r} (in {where_path}): the CRI plugin refuses to start "
                f"{_says('mirrors with config_path')}; move the mirrors to hosts.toml files under config_path",
                stops_cri=True,
            )
        )
    tls = sorted(host for host, config in (registry.get("configs") or {}).items() if (config or {}).get("tls"))
    if tls and _holds("tls with config_path", version):
        setters = sorted({path for host in tls for path in _setters(dump, files, ("registry", "configs", host, "tls"))})
        findings.append(
            Finding(
                f"{key}.configs.<host>.tls ({', '.join(tls)}; in {_where(setters)}) cannot be set when "
                f"{key}.config_path = {config_path!r} (in {where_path}): the CRI plugin refuses to start "
                f"{_says('tls with config_path')}",
                stops_cri=True,
            )
        )
    return findings


def _cni_dirs(dump: dict[str, Any], files: list[ConfigFile], version: ContainerdVersionInfo | None) -> list[Finding]:
    runtime, table, _images, _table = _tables(dump)
    cni = table.get("cni") or {}
    bin_dir, bin_dirs = cni.get("bin_dir"), cni.get("bin_dirs")
    setters = _setters(dump, files, ("cni", "bin_dirs"))
    if runtime != CRI_V3_RUNTIME or not bin_dir or not bin_dirs or not setters or bin_dirs in DEFAULT_BIN_DIRS:
        return []  # 1.x knows no bin_dirs; 2.x drops its own default bin_dirs where bin_dir is set
    if not _holds("cni bin_dir and bin_dirs", version):
        return []
    key = f'plugins."{runtime}".cni'
    return [
        Finding(
            f"{key}.bin_dir = {bin_dir!r} (in {_where(_setters(dump, files, ('cni', 'bin_dir')))}) and "
            f"{key}.bin_dirs = {bin_dirs!r} (in {_where(setters)}) cannot both be set: the CRI plugin refuses to "
            f"start {_says('cni bin_dir and bin_dirs')}; keep bin_dirs only",
            stops_cri=True,
        )
    ]


def _stream_idle_timeout(
    dump: dict[str, Any], files: list[ConfigFile], version: ContainerdVersionInfo | None
) -> list[Finding]:
    """The CRI gRPC plugin's own ``stream_idle_timeout`` (its server config on 2.x, under the same name)."""
    value = (dump.get("plugins", {}).get(CRI_V2) or {}).get("stream_idle_timeout")
    error = parsed_duration(value)[1] if isinstance(value, str) and value else None
    if error is None or not _holds("stream_idle_timeout", version):
        return []
    where = _where(_setters(dump, files, ("stream_idle_timeout",)), "a file")
    return [
        Finding(
            f'plugins."{CRI_V2}".stream_idle_timeout = {value!r} (in {where}) is not a duration: the CRI plugin '
            f'refuses to start {_says("stream_idle_timeout", error)}; write one such as "4h0m0s"',
            stops_cri=True,
        )
    ]


def _untrusted(dump: dict[str, Any], files: list[ConfigFile], version: ContainerdVersionInfo | None) -> list[Finding]:
    """1.x's deprecated ``untrusted_workload_runtime`` (with a runtime_type) beside ``runtimes.untrusted``."""
    runtime, table, _images, _table = _tables(dump)
    containerd = table.get("containerd") or {}
    untrusted = containerd.get("untrusted_workload_runtime") or {}
    runtime_type = untrusted.get("runtime_type") if isinstance(untrusted, dict) else None
    if not runtime_type or "untrusted" not in (containerd.get("runtimes") or {}):
        return []
    if not _holds("untrusted_workload_runtime", version):
        return []
    key = f'plugins."{runtime}".containerd'
    where = _where(_setters(dump, files, ("containerd", "untrusted_workload_runtime", "runtime_type")), "a file")
    where_runtime = _where(_setters(dump, files, ("containerd", "runtimes", "untrusted")), "a file")
    return [
        Finding(
            f"{key}.untrusted_workload_runtime (runtime_type = {runtime_type!r}; in {where}) and "
            f"{key}.runtimes.untrusted (in {where_runtime}) both define the untrusted runtime: the CRI plugin "
            f"refuses to start {_says('untrusted_workload_runtime')}; keep runtimes.untrusted only",
            stops_cri=True,
        )
    ]


def _runtimes(dump: dict[str, Any], files: list[ConfigFile], version: ContainerdVersionInfo | None) -> list[Finding]:
    runtime, table, _images, _table = _tables(dump)
    containerd = table.get("containerd") or {}
    runtimes = containerd.get("runtimes") or {}
    key = f'plugins."{runtime}".containerd'
    findings = []
    default = containerd.get("default_runtime_name")
    if not default:
        if _holds("default runtime empty", version):
            findings.append(
                Finding(
                    f"{key}.default_runtime_name is empty (in "
                    f"{_where(_setters(dump, files, ('containerd', 'default_runtime_name'), empty=True), 'a file')}): "
                    f"the CRI plugin refuses to start {_says('default runtime empty')}",
                    stops_cri=True,
                )
            )
    elif default not in runtimes and _holds("default runtime undefined", version):
        findings.append(
            Finding(
                f"{key}.default_runtime_name = {default!r} (in "
                f"{_where(_setters(dump, files, ('containerd', 'default_runtime_name')))}) names no runtime the "
                f"merged config defines (runtimes: {', '.join(sorted(runtimes)) or 'none'}): the CRI plugin "
                f"refuses to start {_says('default runtime undefined', default)}",
                stops_cri=True,
            )
        )
    for name, runtime_table in sorted(runtimes.items()):
        path = ("containerd", "runtimes", name)
        if not runtime_table.get("runtime_type"):
            findings.append(
                Finding(
                    f"{key}.runtimes.{name} sets no runtime_type (in {_where(_setters(dump, files, path), 'a file')}): "
                    "the CRI plugin reads its options as no runtime's, so runc options such as BinaryName and "
                    f'SystemdCgroup are not applied; set runtime_type = "{RUNC_V2}"',
                    stops_cri=False,
                )
            )
        spellings: dict[str, list[str]] = {}
        for option in runtime_table.get("options") or {}:
            spellings.setdefault(option.lower(), []).append(option)
        for same in (sorted(group) for group in spellings.values() if len(group) > 1):
            values = ", ".join(f"{option} = {runtime_table['options'][option]!r}" for option in same)
            setters = sorted({file for option in same for file in _setters(dump, files, (*path, "options", option))})
            findings.append(
                Finding(
                    f"{key}.runtimes.{name}.options sets one option in {len(same)} spellings ({values}; in "
                    f"{_where(setters, 'a file')}): containerd reads every spelling into the same option, so "
                    "only one of the values takes effect; keep one spelling",
                    stops_cri=False,
                )
            )
    return findings


def _required(
    dump: dict[str, Any], files: list[ConfigFile], findings: list[Finding], version: ContainerdVersionInfo | None
) -> list[Finding]:
    names = [name for name in dump.get("required_plugins") or [] if name in CRI_PLUGINS]
    if not names or not any(finding.stops_cri for finding in findings) or not _holds("required_plugins", version):
        return []
    where = _where(_top_setters(files, "required_plugins", names), "a file")
    return [
        Finding(
            f"required_plugins names {', '.join(names)} (in {where}): "
            "the whole containerd daemon would exit at start, not only its CRI plugin",
            stops_cri=True,
        )
    ]


def import_findings(missing: Sequence[MissingImport]) -> list[Finding]:
    """The ``imports`` entries naming files that do not exist (``containerd_files.missing_imports``):
    containerd exits at start, so neither the daemon nor its CRI plugin runs (every version: the
    ``missing import`` rule has no range)."""
    findings = []
    for item in missing:
        ours = f" ({OUR_DROPIN} is gpunode's drop-in: a run writes it again)" if item["path"] == OUR_DROPIN else ""
        findings.append(
            Finding(
                f"{missing_import_text(item)}: {MISSING_IMPORT_EFFECT}; put the file back or remove the entry{ours}",
                stops_cri=True,
            )
        )
    return findings


def cri_start_findings(
    dump: dict[str, Any],
    files: list[ConfigFile],
    missing: Sequence[MissingImport] = (),
    version: ContainerdVersionInfo | None = None,
) -> list[Finding]:
    """What the CRI plugin would refuse, or run other than the files say, in the merged config
    ``dump`` (``config dump`` parsed) read from ``files`` (``load_order``), whose ``imports`` name
    the ``missing`` files. A missing import comes first and alone: containerd exits before any
    plugin reads its config (and 2.x's dump is then partial). A disabled CRI plugin comes next and
    alone: nothing else of the plugin's config is read then. With the node's containerd ``version``,
    a rule of ``START_RULES`` is applied only where that version makes its check; without one, every
    rule is."""
    if missing:
        return import_findings(missing)
    findings = _disabled(dump, files, version) or [
        *_untrusted(dump, files, version),
        *_registry(dump, files, version),
        *_cni_dirs(dump, files, version),
        *_runtimes(dump, files, version),
        *_stream_idle_timeout(dump, files, version),
    ]
    return findings + _required(dump, files, findings, version)


def stopping(findings: list[Finding]) -> str | None:
    """The findings that keep the CRI plugin from starting, as one message, or ``None``."""
    messages = [finding.message for finding in findings if finding.stops_cri]
    return "; ".join(messages) or None
