"""Facts about containerd: version, config files, the merged config, the service and the CRI plugin."""

from __future__ import annotations

import base64
import re
import shlex
import tomllib
from datetime import UTC, datetime
from typing import Any, TypedDict

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from typing_extensions import override

from pyinfra_gpunode.containerd_dump import CriLoaded, DumpSummary, parse_cri_start_log, summarize
from pyinfra_gpunode.containerd_files import CONFIG_ROOT, ConfigFile, resolve_tree
from pyinfra_gpunode.sections import marker, split_sections
from pyinfra_gpunode.versions import ContainerdVersionInfo, parse_containerd_version

DEFAULT_CONFIG = f"{CONFIG_ROOT}/config.toml"

# The config path as the unit starts containerd: `--config X`, `--config=X` or `-c X` in ExecStart.
_UNIT_CONFIG = (
    "cfg=$(systemctl show -p ExecStart --value containerd 2>/dev/null | "
    "sed -n 's/.*argv\\[\\]=\\([^;]*\\);.*/\\1/p' | "
    "awk '{for (i = 1; i <= NF; i++) { if ($i == \"--config\" || $i == \"-c\") print $(i+1); "
    "else if ($i ~ /^--config=/) print substr($i, 10) }}' | head -n 1); "
    f'cfg=${{cfg:-{DEFAULT_CONFIG}}}'
)
_CFG = '"$cfg"'  # the path _UNIT_CONFIG found, in later parts of the same command


class ContainerdVersion(FactBase[ContainerdVersionInfo | None]):
    """
    Returns containerd's version from ``containerd --version`` (Debian, upstream and
    containerd.io forms), or ``None`` when containerd is not installed.

    .. code:: python

        {"major": 1, "minor": 7, "patch": 24, "raw": "1.7.24~ds1", "build": "github.com/containerd/containerd"}
    """

    @override
    def requires_command(self) -> str:
        return "containerd"

    @override
    def command(self) -> str:
        return "containerd --version"

    @override
    def process(self, output: list[str]) -> ContainerdVersionInfo | None:
        version = parse_containerd_version(output[0]) if output else None
        if version is None:
            raise FactProcessError(f"containerd --version printed an unknown form: {output!r}")
        return version


class ContainerdConfigFilesInfo(TypedDict):
    main: ConfigFile | None
    main_path: str
    imported: list[ConfigFile]
    problems: list[str]
    texts: dict[str, str]
    mtimes: dict[str, int]


class ContainerdConfigFiles(FactBase[ContainerdConfigFilesInfo]):
    """
    Returns containerd's main config (the path the service starts it with, default
    ``/etc/containerd/config.toml``; ``main`` is ``None`` when it is missing) and every file
    it imports, in containerd's own load order (byte-order globs, breadth-first, no
    duplicates), each with its ``version``, ``imports``, top-level plugin keys and parse error.
    ``texts`` holds every ``*.toml`` under ``/etc/containerd``; ``problems`` lists imports that
    name missing files or files outside ``/etc/containerd``.

    .. code:: python

        {
            "main_path": "/etc/containerd/config.toml",
            "main": {"path": "/etc/containerd/config.toml", "version": 2,
                     "imports": ["/etc/containerd/conf.d/*.toml"],
                     "plugins": ["io.containerd.grpc.v1.cri"], "error": None, "text": "..."},
            "imported": [{"path": "/etc/containerd/conf.d/99-registry.toml", "version": 2, ...}],
            "problems": [],
            "texts": {"/etc/containerd/config.toml": "...", ...},
            "mtimes": {"/etc/containerd/config.toml": 1764400000, ...},
        }
    """

    @override
    def command(self) -> str:
        return (
            f"{_UNIT_CONFIG}; echo \"main $cfg\"; "
            f'{{ echo "$cfg"; find {CONFIG_ROOT} -name "*.toml" -type f 2>/dev/null; }} | sort -u | '
            'while read -r f; do if [ -r "$f" ] && [ -f "$f" ]; then '
            'echo "file $(stat -c %Y "$f") $(printf %s "$f" | base64 -w0) $(base64 -w0 < "$f")"; '
            "fi; done"
        )

    @override
    def process(self, output: list[str]) -> ContainerdConfigFilesInfo:
        main_path = DEFAULT_CONFIG
        texts: dict[str, str] = {}
        mtimes: dict[str, int] = {}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "main":
                main_path = rest.strip()
            elif kind == "file":
                mtime, path_b64, *content = rest.split(" ")
                path = base64.b64decode(path_b64).decode()
                texts[path] = base64.b64decode(content[0] if content else "").decode()
                mtimes[path] = int(mtime)
        tree = resolve_tree(main_path, texts)
        info: ContainerdConfigFilesInfo = {
            "main": tree["main"],
            "main_path": tree["main_path"],
            "imported": tree["imported"],
            "problems": tree["problems"],
            "texts": texts,
            "mtimes": mtimes,
        }
        return info


class DumpInfo(TypedDict):
    summary: DumpSummary | None
    dump: dict[str, Any]
    warnings: list[str]
    error: str | None


def _dump_script(config: str) -> str:
    """Run ``config dump`` for ``config``; stdout, then stderr and the exit code behind markers."""
    return (
        'err=$(mktemp) && { '
        f'containerd --config {config} config dump 2>"$err"; rc=$?; '
        'echo "### gpunode-stderr"; cat "$err"; echo "### gpunode-rc $rc"; rm -f "$err"; }'
    )


def _process_dump(output: list[str]) -> DumpInfo:
    marker = output.index("### gpunode-stderr") if "### gpunode-stderr" in output else len(output)
    stderr = [line for line in output[marker + 1 :] if not line.startswith("### gpunode-rc")]
    rc_line = next((line for line in output if line.startswith("### gpunode-rc")), "### gpunode-rc 0")
    warnings = [line for line in stderr if "level=warning" in line or "Ignoring unknown key" in line]
    if rc_line.split()[-1] != "0":
        return {"summary": None, "dump": {}, "warnings": warnings, "error": "\n".join(stderr) or rc_line}
    try:
        dump = tomllib.loads("\n".join(output[:marker]))
    except tomllib.TOMLDecodeError as exc:
        return {"summary": None, "dump": {}, "warnings": warnings, "error": f"dump is not TOML: {exc}"}
    return {"summary": summarize(dump), "dump": dump, "warnings": warnings, "error": None}


class ContainerdConfigDump(FactBase[DumpInfo | None]):
    """
    Returns the merged config from ``containerd config dump`` (the files on disk over the
    binary's defaults, not the running daemon), parsed, with a version-aware ``summary``
    and the stderr ``warnings`` (e.g. "Ignoring unknown key"); ``error`` when the files do
    not load. ``None`` when containerd is not installed.

    + config_path: main config file, default ``/etc/containerd/config.toml``

    .. code:: python

        {
            "summary": {"dump_version": 2, "runtimes": {"nvidia": {...}, "runc": {...}},
                        "default_runtime_name": "runc", "default_runtime_present": True,
                        "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],
                        "registry_config_path": "/etc/containerd/certs.d"},
            "dump": {"version": 2, "plugins": {...}},
            "warnings": [],
            "error": None,
        }
    """

    @override
    def requires_command(self, config_path: str = DEFAULT_CONFIG) -> str:
        return "containerd"

    @override
    def command(self, config_path: str = DEFAULT_CONFIG) -> str:
        return _dump_script(shlex.quote(config_path))

    @override
    def process(self, output: list[str]) -> DumpInfo:
        return _process_dump(output)


STAGE = "@GPUNODE_STAGE@"  # must match containerd_dropin.staged_imports


class ContainerdCandidateDump(FactBase[DumpInfo | None]):
    """
    Returns ``config dump`` of a candidate config tree, staged in a temporary directory on
    the node (a copy of ``/etc/containerd`` with the new config.toml and drop-in) and removed
    afterwards, so the node's own containerd judges the files before they take effect.
    Import entries in ``config_text`` that start with ``@GPUNODE_STAGE@`` point into the stage.

    + config_path: where the main config lives on the node
    + config_text: candidate main config
    + dropin_path: where the drop-in will live on the node
    + dropin_text: candidate drop-in

    .. code:: python

        {"summary": {...}, "dump": {...}, "warnings": [], "error": None}
    """

    @override
    def requires_command(self, config_path: str, config_text: str, dropin_path: str, dropin_text: str) -> str:
        return "containerd"

    @override
    def command(self, config_path: str, config_text: str, dropin_path: str, dropin_text: str) -> str:
        def write(path: str, text: str) -> str:
            staged = f'"$T"{shlex.quote(path)}'
            encoded = base64.b64encode(text.encode()).decode()
            return (
                f'mkdir -p "$(dirname {staged})" && echo {encoded} | base64 -d | '
                f'sed "s#{STAGE}#$T#g" > {staged}'
            )

        return (
            'T=$(mktemp -d) && trap \'rm -rf "$T"\' EXIT && mkdir -p "$T/etc" && '
            f'{{ if [ -d {CONFIG_ROOT} ]; then cp -a {CONFIG_ROOT} "$T/etc/"; fi; }} && '
            f"{write(config_path, config_text)} && {write(dropin_path, dropin_text)} && "
            + _dump_script(f'"$T"{shlex.quote(config_path)}')
        )

    @override
    def process(self, output: list[str]) -> DumpInfo:
        return _process_dump(output)


class ContainerdServiceInfo(TypedDict):
    active_state: str
    sub_state: str
    result: str
    main_pid: int
    restart: str
    restart_usec: str
    n_restarts: int
    started_at: float | None
    invocation_id: str
    config_mtime: float | None
    restart_pending: bool


def _epoch(timestamp: str) -> float | None:
    """``Sun 2026-11-29 09:00:00.482113 UTC`` (``--timestamp=us+utc``) as epoch seconds."""
    try:
        moment = datetime.strptime(timestamp, "%a %Y-%m-%d %H:%M:%S.%f UTC")
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC).timestamp()


class ContainerdService(FactBase[ContainerdServiceInfo | None]):
    """
    Returns the containerd unit's state: ``Restart``, ``RestartUSec``, active/sub state, ``Result``,
    ``MainPID``, start time (epoch seconds), ``NRestarts``, the invocation ID, the newest
    mtime under ``/etc/containerd``, and ``restart_pending`` when a config file is newer than
    the running daemon. ``None`` without systemd (a chroot or image build).

    .. code:: python

        {"active_state": "active", "sub_state": "running", "result": "success", "main_pid": 73,
         "restart": "always",
         "restart_usec": "5s", "n_restarts": 0, "started_at": 1764406000.482113,
         "invocation_id": "9f0c...", "config_mtime": 1764405000.5, "restart_pending": False}
    """

    @override
    def requires_command(self) -> str:
        return "systemctl"

    @override
    def command(self) -> str:
        return (
            "if [ -d /run/systemd/system ]; then "
            "systemctl show containerd --timestamp=us+utc -p ActiveState -p SubState -p MainPID "
            "-p Result -p Restart -p RestartUSec -p NRestarts -p ExecMainStartTimestamp -p InvocationID; "
            f"echo ConfigMtime=$(find {CONFIG_ROOT} -type f -printf '%T@\\n' 2>/dev/null | sort -n | tail -n 1); "
            "fi"
        )

    @override
    def process(self, output: list[str]) -> ContainerdServiceInfo:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        started_at = _epoch(values.get("ExecMainStartTimestamp", ""))
        mtime = values.get("ConfigMtime", "")
        config_mtime = float(mtime) if re.fullmatch(r"\d+(\.\d+)?", mtime) else None
        active = values.get("ActiveState", "")
        return {
            "active_state": active,
            "sub_state": values.get("SubState", ""),
            "result": values.get("Result", ""),
            "main_pid": int(values.get("MainPID", "0") or 0),
            "restart": values.get("Restart", ""),
            "restart_usec": values.get("RestartUSec", ""),
            "n_restarts": int(values.get("NRestarts", "0") or 0),
            "started_at": started_at,
            "invocation_id": values.get("InvocationID", ""),
            "config_mtime": config_mtime,
            "restart_pending": bool(
                active == "active" and started_at and config_mtime and config_mtime > started_at
            ),
        }


class ContainerdCriLoaded(FactBase[CriLoaded]):
    """
    Returns what the *running* daemon's CRI plugin loaded, read from the plugin's own start
    line in the journal of the unit's current invocation ("Start cri plugin with config" on
    1.x, "starting cri plugin" on 2.x) or its "failed to load plugin" line. 2.x does not log
    the registry settings (``registry_config_path`` is then ``None``).

    .. code:: python

        {"loaded": True, "runtimes": ["nvidia", "runc"], "default_runtime_name": "runc",
         "enable_cdi": True, "registry_config_path": "/etc/containerd/certs.d", "error": None}
    """

    @staticmethod
    def default() -> CriLoaded:
        return {**parse_cri_start_log([]), "error": "no CRI plugin start line for the running containerd"}

    @override
    def requires_command(self) -> str:
        return "journalctl"

    @override
    def command(self) -> str:
        return (
            "id=$(systemctl show -p InvocationID --value containerd 2>/dev/null); "
            'if [ -n "$id" ]; then journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" | '
            "grep -E 'failed to load plugin io.containerd.(grpc.v1.cri|cri)|"
            "Start cri plugin with config|starting cri plugin' || true; fi"
        )

    @override
    def process(self, output: list[str]) -> CriLoaded:
        return parse_cri_start_log(output)


class ContainerdNodeStateInfo(TypedDict):
    version: ContainerdVersionInfo | None
    files: ContainerdConfigFilesInfo
    dump: DumpInfo | None
    binary_present: bool
    service: ContainerdServiceInfo | None


class ContainerdNodeState(FactBase[ContainerdNodeStateInfo]):
    """
    Returns in one command what registering the nvidia runtime reads: ``ContainerdVersion``,
    ``ContainerdConfigFiles``, ``ContainerdConfigDump`` of the main config the unit uses,
    whether the runtime ``binary`` exists, and ``ContainerdService``, each as those facts
    return it (``None`` where containerd or systemd is missing).

    + binary: path of the nvidia runtime binary

    .. code:: python

        {"version": {"major": 1, "minor": 7, ...}, "files": {"main_path": "...", ...},
         "dump": {"summary": {...}, "dump": {...}, "warnings": [], "error": None},
         "binary_present": True, "service": {"active_state": "active", ...}}
    """

    @override
    def command(self, binary: str) -> str:
        has_containerd = "command -v containerd >/dev/null 2>&1"
        return "; ".join([
            marker("version"),
            f"if {has_containerd}; then containerd --version; fi",
            marker("files"),
            ContainerdConfigFiles().command(),
            marker("dump"),
            f"if {has_containerd}; then {_dump_script(_CFG)}; fi",
            marker("binary"),
            f"if [ -e {shlex.quote(binary)} ]; then echo present; fi",
            marker("service"),
            f"if command -v systemctl >/dev/null 2>&1; then {ContainerdService().command()}; fi",
        ])

    @override
    def process(self, output: list[str]) -> ContainerdNodeStateInfo:
        sections = split_sections(output)
        version, dump, service = (sections.get(name, []) for name in ("version", "dump", "service"))
        return {
            "version": ContainerdVersion().process(version) if version else None,
            "files": ContainerdConfigFiles().process(sections.get("files", [])),
            "dump": _process_dump(dump) if dump else None,
            "binary_present": "present" in sections.get("binary", []),
            "service": ContainerdService().process(service) if service else None,
        }
