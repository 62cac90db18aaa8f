"""Facts about containerd: version, config files, the merged config, the service and the CRI plugin."""

from __future__ import annotations

import base64
import re
import shlex
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError, PyinfraError
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.containerd_dropin import OUR_DROPIN
from pyinfra_gpunode.containerd_dump import (
    CriLoaded,
    DumpSummary,
    parse_cri_loaded,
    parse_cri_start_log,
    parsed_dump,
    summarize,
    warning_text,
)
from pyinfra_gpunode.containerd_files import CONFIG_ROOT, ConfigFile, resolve_tree
from pyinfra_gpunode.facts._composite import Part
from pyinfra_gpunode.facts.platform import ContainerdPlatform
from pyinfra_gpunode.platform import ContainerdPlatformInfo, owning_platform
from pyinfra_gpunode.read_limits import DUMP_BYTES, TIMED_OUT, TIMED_OUT_LINE, VERSION_SECONDS, did_not_answer
from pyinfra_gpunode.read_limits import dump_seconds as limit_of_dump
from pyinfra_gpunode.rollout import MARKER_BYTES, TURN_MARKER
from pyinfra_gpunode.sections import MARK, marker, split_sections
from pyinfra_gpunode.versions import ContainerdVersionInfo, parse_containerd_version

DEFAULT_CONFIG = f"{CONFIG_ROOT}/config.toml"

# The config path as the unit starts containerd: `--config X`, `--config=X` or `-c X` in ExecStart
# (shell/unit-config.sh), set as `cfg` for later parts of the same command.
_SHELL = Path(__file__).parent / "shell"
_UNIT_CONFIG_SCRIPT = shell.script(_SHELL / "unit-config.sh")
_UNIT_CONFIG = f"cfg=$({shell.command(_UNIT_CONFIG_SCRIPT, 'gpunode-unit-config', DEFAULT_CONFIG)})"
_CFG = shell.Expanded('"$cfg"')  # the path _UNIT_CONFIG found, in later parts of the same command
# Print the config tree: the main config and every *.toml with mode, owner and text, file kinds and links
# (shell/config-files.sh).
_CONFIG_FILES = shell.script(_SHELL / "config-files.sh")
# Print `config dump` of a config, then its stderr and exit status behind markers (shell/config-dump.sh).
_CONFIG_DUMP = shell.script(_SHELL / "config-dump.sh")
# The same for a candidate tree staged in a temporary directory (shell/candidate-dump.sh).
_CANDIDATE_DUMP = shell.script(_SHELL / "candidate-dump.sh")
# Print the unit's state, containerd's processes and the config tree's newest mtime (shell/containerd-service.sh).
_SERVICE = shell.script(_SHELL / "containerd-service.sh")
# Print the CRI plugin's start line or ctr's answer (shell/containerd-cri.sh).
_CRI = shell.script(_SHELL / "containerd-cri.sh")


# containerd's version, or VERSION_TIMED_OUT where it did not answer in time.
VERSION_TIMED_OUT = TIMED_OUT_LINE
VERSION_COMMAND = (
    f"timeout {VERSION_SECONDS} containerd --version || [ $? != {TIMED_OUT} ] || echo {shlex.quote(VERSION_TIMED_OUT)}"
)


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
        return VERSION_COMMAND

    @override
    def process(self, output: list[str]) -> ContainerdVersionInfo | None:
        if output == [VERSION_TIMED_OUT]:
            raise FactProcessError(did_not_answer("containerd --version", VERSION_SECONDS))
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
    modes: dict[str, str]
    owners: dict[str, str]
    kinds: dict[str, str]
    links: dict[str, str]


class ContainerdConfigFiles(FactBase[ContainerdConfigFilesInfo]):
    """
    Returns containerd's main config (the path the service starts it with, default
    ``/etc/containerd/config.toml``; ``main`` is ``None`` when it is missing) and every file
    it imports, in containerd's own load order (byte-order globs, breadth-first, no
    duplicates), each with its ``version``, ``imports``, top-level plugin keys and parse error.
    ``texts`` holds every ``*.toml`` under ``/etc/containerd`` (read through symbolic links; a
    byte that is not UTF-8 is kept as a surrogate escape, which the file's ``error`` names),
    with its mtime, permission bits and numeric ``owner:group``; ``kinds`` gives the file type
    (``stat -c %F``: ``regular file``, ``directory``, ...) of the main config, of
    ``/etc/containerd/gpunode/nvidia-runtime.toml`` and of every directory above them that
    exists and is not a symbolic link; ``links`` maps every symbolic link under
    ``/etc/containerd``, and the main config or a directory above it that is one, to its
    target; ``problems`` lists imports that name missing files (containerd exits at start on one),
    files other than ``*.toml`` (not read) or files outside ``/etc/containerd``.

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
            "modes": {"/etc/containerd/config.toml": "644", ...},
            "owners": {"/etc/containerd/config.toml": "0:0", ...},
            "kinds": {"/etc/containerd/config.toml": "regular file", "/etc/containerd": "directory", ...},
            "links": {},
        }
    """

    @override
    def command(self) -> str:
        return f"{_UNIT_CONFIG}; {shell.command(_CONFIG_FILES, 'gpunode-config-files', _CFG, CONFIG_ROOT, OUR_DROPIN)}"

    @override
    def process(self, output: list[str]) -> ContainerdConfigFilesInfo:
        main_path = DEFAULT_CONFIG
        texts: dict[str, str] = {}
        mtimes: dict[str, int] = {}
        modes: dict[str, str] = {}
        owners: dict[str, str] = {}
        kinds: dict[str, str] = {}
        links: dict[str, str] = {}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "main":
                main_path = rest.strip()
            elif kind == "file":
                mtime, path_b64, *content = rest.split(" ")
                path = _decoded(path_b64)
                texts[path] = base64.b64decode(content[0] if content else "").decode(errors="surrogateescape")
                mtimes[path] = int(mtime)
            elif kind == "mode":
                mode, _, path_b64 = rest.partition(" ")
                modes[_decoded(path_b64)] = mode
            elif kind == "owner":
                owner, _, path_b64 = rest.partition(" ")
                if re.fullmatch(r"\d+:\d+", owner):
                    owners[_decoded(path_b64)] = owner
            elif kind == "kind":
                path_b64, _, file_type = rest.partition(" ")
                kinds[_decoded(path_b64)] = file_type
            elif kind == "link":
                path_b64, _, target_b64 = rest.partition(" ")
                links[_decoded(path_b64)] = _decoded(target_b64)
        tree = resolve_tree(main_path, texts)
        info: ContainerdConfigFilesInfo = {
            "main": tree["main"],
            "main_path": tree["main_path"],
            "imported": tree["imported"],
            "problems": tree["problems"],
            "texts": texts,
            "mtimes": mtimes,
            "modes": modes,
            "owners": owners,
            "kinds": kinds,
            "links": links,
        }
        return info


def _decoded(encoded: str) -> str:
    """A base64 path; bytes that are not UTF-8 shown as ``\\xNN`` (paths end up in messages)."""
    return base64.b64decode(encoded).decode(errors="backslashreplace")


class DumpInfo(TypedDict):
    summary: DumpSummary | None
    dump: dict[str, Any]
    warnings: list[str]
    error: str | None


def dump_seconds() -> int:
    """``read_limits.dump_seconds``, a bad ``GPUNODE_DUMP_SECONDS`` as pyinfra's error (no traceback)."""
    try:
        return limit_of_dump()
    except ValueError as error:
        raise PyinfraError(str(error)) from None


def dump_command(config: str) -> str:
    """Run ``config dump`` for the config ``config`` (a path, or an ``Expanded`` variable); stdout, then stderr and
    the exit code behind markers."""
    return shell.command(_CONFIG_DUMP, "gpunode-config-dump", config, str(dump_seconds()), str(DUMP_BYTES))


def _process_dump(output: list[str]) -> DumpInfo:
    marker = output.index("### gpunode-stderr") if "### gpunode-stderr" in output else len(output)
    stderr = [line for line in output[marker + 1 :] if not line.startswith("### gpunode-rc")]
    rc_line = next((line for line in output if line.startswith("### gpunode-rc")), "### gpunode-rc 0")
    # Without the fields that differ on every run (time, t=): the same warning read at two moments is one.
    warnings = [warning_text(line) for line in stderr if "level=warning" in line or "Ignoring unknown key" in line]
    rc = rc_line.split()[-1]
    if rc == "stage":
        error = "could not stage the candidate: " + "\n".join(stderr)
        return {"summary": None, "dump": {}, "warnings": [], "error": error}
    if rc == str(TIMED_OUT):
        error = did_not_answer("containerd config dump", dump_seconds())
        return {"summary": None, "dump": {}, "warnings": [], "error": error}
    if rc != "0":
        return {"summary": None, "dump": {}, "warnings": warnings, "error": "\n".join(stderr) or rc_line}
    try:
        dump = parsed_dump("\n".join(output[:marker]))
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
        return dump_command(config_path)

    @override
    def process(self, output: list[str]) -> DumpInfo:
        return _process_dump(output)


STAGE = "@GPUNODE_STAGE@"  # must match containerd_dropin.staged_imports


def candidate_dump_command(config_path: str, dropin_path: str, root: str = CONFIG_ROOT, bin_dir: str = "") -> str:
    """``config dump`` of a candidate tree: every ``*.toml`` under ``root`` copied into a temporary directory with
    the candidate ``config_path`` and ``dropin_path`` (their texts on stdin, ``candidate_input``), dumped by the
    containerd in ``bin_dir`` (``""``: the first on PATH); the stage is removed afterwards."""
    return shell.command(
        _CANDIDATE_DUMP,
        "gpunode-candidate-dump",
        *(bin_dir, root, config_path, dropin_path, STAGE, str(dump_seconds()), str(DUMP_BYTES)),
    )


def candidate_input(config_text: str, dropin_text: str) -> str:
    """``ContainerdCandidateDump``'s stdin: the candidate config.toml and drop-in, base64, a line each."""
    return "".join(base64.b64encode(text.encode()).decode() + "\n" for text in (config_text, dropin_text))


class ContainerdCandidateDump(FactBase[DumpInfo | None]):
    """
    Returns ``config dump`` of a candidate config tree, staged in a temporary directory on
    the node (a copy of every ``*.toml`` under ``/etc/containerd``, read through symbolic
    links, with the new config.toml and drop-in) and removed afterwards, so the node's own
    containerd judges the files before they take effect. Nothing is written outside the
    stage. The candidate texts come on stdin (``_stdin=candidate_input(config_text,
    dropin_text)``), so their size is not bound by the command line's. Import entries that
    start with ``@GPUNODE_STAGE@`` point into the stage.

    + config_path: where the main config lives on the node
    + dropin_path: where the drop-in will live on the node

    .. code:: python

        {"summary": {...}, "dump": {...}, "warnings": [], "error": None}
    """

    @override
    def requires_command(self, config_path: str, dropin_path: str) -> str:
        return "containerd"

    @override
    def command(self, config_path: str, dropin_path: str) -> str:
        return candidate_dump_command(config_path, dropin_path)

    @override
    def process(self, output: list[str]) -> DumpInfo:
        return _process_dump(output)


class ContainerdProcess(TypedDict):
    pid: int
    unit: str  # the systemd unit whose cgroup it runs in ("" when none)


class ContainerdServiceInfo(TypedDict):
    load_state: str
    triggered_by: list[str]
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
    processes: list[ContainerdProcess]
    restart_reason: str | None
    restart_pending: bool


def _epoch(timestamp: str) -> float | None:
    """``Sun 2026-11-29 09:00:00.482113 UTC`` (``--timestamp=us+utc``) as epoch seconds."""
    try:
        moment = datetime.strptime(timestamp, "%a %Y-%m-%d %H:%M:%S.%f UTC")
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC).timestamp()


def _restart_reason(
    load_state: str, active: str, sub: str, result: str, started_at: float | None, config_mtime: float | None
) -> str | None:
    if load_state != "loaded":
        return None
    if active != "active":
        return f"containerd is {active or 'unknown'} ({sub or '?'}, result {result or '?'})"
    if started_at and config_mtime and config_mtime > started_at:
        return "its config is newer than the daemon"
    return None


def service_command(unit: str = "containerd", config_root: str | None = None, generated: str | None = None) -> str:
    """``ContainerdService``'s command; ``unit``, ``config_root`` and ``generated``: where a platform (k3s,
    RKE2, k0s) runs containerd in a unit of its own, that unit, the directory of its config (its mtimes
    instead of /etc/containerd's and the main config's) and the config the platform writes at each start of
    the unit, before it starts containerd (left out of the mtimes: it is newer than the unit's main process by
    design)."""
    if config_root is None:
        read = f"{_UNIT_CONFIG}; {shell.command(_SERVICE, 'gpunode-containerd-service', unit, '', CONFIG_ROOT, _CFG)}"
    else:
        read = shell.command(_SERVICE, "gpunode-containerd-service", unit, generated or "", config_root)
    return f"if [ -d /run/systemd/system ]; then {read}; fi"


class ContainerdService(FactBase[ContainerdServiceInfo | None]):
    """
    Returns the containerd unit's state: ``LoadState``, ``TriggeredBy`` (a socket that activates
    it), ``Restart``, ``RestartUSec``, active/sub state, ``Result``, ``MainPID``, start time (epoch
    seconds), ``NRestarts``, the invocation ID, the newest mtime of the config tree (``/etc/containerd``
    and the main config the unit names; a symlinked file counts with its target's and its own), every
    ``containerd`` process with the unit it runs in, and
    ``restart_reason``/``restart_pending`` when the daemon must be restarted: a config file newer
    than the running daemon, or a unit that is not active (failed, stopped, restarting).
    ``None`` without systemd (a chroot or image build).

    .. code:: python

        {"load_state": "loaded", "triggered_by": [], "active_state": "active", "sub_state": "running",
         "result": "success", "main_pid": 73, "restart": "always", "restart_usec": "5s", "n_restarts": 0,
         "started_at": 1764406000.482113, "invocation_id": "9f0c...", "config_mtime": 1764405000.5,
         "processes": [{"pid": 73, "unit": "containerd.service"}], "restart_reason": None,
         "restart_pending": False}
    """

    @override
    def requires_command(self) -> str:
        return "systemctl"

    @override
    def command(self) -> str:
        return service_command()

    @override
    def process(self, output: list[str]) -> ContainerdServiceInfo:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        started_at = _epoch(values.get("ExecMainStartTimestamp", ""))
        mtime = values.get("ConfigMtime", "")
        config_mtime = float(mtime) if re.fullmatch(r"\d+(\.\d+)?", mtime) else None
        load_state, active = values.get("LoadState", "loaded"), values.get("ActiveState", "")
        sub, result = values.get("SubState", ""), values.get("Result", "")
        processes: list[ContainerdProcess] = [
            {"pid": int(pid), "unit": unit}
            for pid, _, unit in (item.partition(":") for item in values.get("Processes", "").split())
            if pid.isdigit()
        ]
        reason = _restart_reason(load_state, active, sub, result, started_at, config_mtime)
        return {
            "load_state": load_state,
            "triggered_by": values.get("TriggeredBy", "").split(),
            "active_state": active,
            "sub_state": sub,
            "result": result,
            "main_pid": int(values.get("MainPID", "0") or 0),
            "restart": values.get("Restart", ""),
            "restart_usec": values.get("RestartUSec", ""),
            "n_restarts": int(values.get("NRestarts", "0") or 0),
            "started_at": started_at,
            "invocation_id": values.get("InvocationID", ""),
            "config_mtime": config_mtime,
            "processes": processes,
            "restart_reason": reason,
            "restart_pending": reason is not None,
        }


DEFAULT_ADDRESS = "/run/containerd/containerd.sock"


def cri_address(dump: Mapping[str, Any] | None) -> str:
    """containerd's gRPC socket as the merged config (a ``DumpInfo``) sets it (``ctr`` asks the CRI plugin there)."""
    return str((dump["dump"] if dump else {}).get("grpc", {}).get("address") or DEFAULT_ADDRESS)


class ContainerdCriLoaded(FactBase[CriLoaded]):
    """
    Returns what the *running* daemon's CRI plugin loaded, read from the plugin's own start
    line in the journal of the unit's current invocation ("Start cri plugin with config" on
    1.x, "starting cri plugin" on 2.x) or its "failed to load plugin" line. Where containerd
    logs no such line (``[debug] level`` above info, or logging elsewhere) the CRI plugins'
    status comes from ``ctr plugins ls`` instead (``source`` says which): ``ok`` or the
    plugin's error, without the runtimes it loaded. 2.x does not log the registry settings
    (``registry_config_path`` is then ``None``).

    + address: containerd's gRPC socket, for ``ctr``

    .. code:: python

        {"loaded": True, "runtimes": ["nvidia", "runc"], "default_runtime_name": "runc",
         "enable_cdi": True, "registry_config_path": "/etc/containerd/certs.d", "error": None,
         "source": "the CRI plugin's start line in the journal"}
    """

    @staticmethod
    def default() -> CriLoaded:
        return {**parse_cri_start_log([]), "error": "no CRI plugin start line for the running containerd"}

    @override
    def requires_command(self, address: str = DEFAULT_ADDRESS) -> str:
        return "journalctl"

    @override
    def command(self, address: str = DEFAULT_ADDRESS) -> str:
        return cri_loaded_command(address)

    @override
    def process(self, output: list[str]) -> CriLoaded:
        sections = split_sections(output)
        loaded = parse_cri_loaded(sections.get("journal", []), sections.get("ctr", []))
        if not loaded["source"]:
            return self.default()
        return loaded


# The CRI plugin's start or failure lines, as ``grep -E`` finds them.
CRI_LINES = (
    "failed to load plugin io.containerd.(grpc.v1.cri|cri)|"
    'failed to load plugin" error=.* id=io.containerd.(grpc.v1.cri|cri.v1.[a-z]+)( |$)|'
    "Start cri plugin with config|starting cri plugin"
)
LOG_BYTES = 16777216  # at most this much of the end of a platform's containerd log file is read


def cri_loaded_command(address: str = DEFAULT_ADDRESS, unit: str = "containerd", log: str | None = None) -> str:
    """``ContainerdCriLoaded``'s command; ``unit``: the systemd unit containerd runs in (a platform's own,
    e.g. ``k3s-agent.service``); ``log``: the file a platform writes its containerd's log to (k3s and RKE2),
    whose last CRI start or failure line is read where the unit's journal has none."""
    return shell.command(_CRI, "gpunode-containerd-cri", MARK, CRI_LINES, address, unit, log or "", str(LOG_BYTES))


class ContainerdNodeStateInfo(TypedDict):
    version: ContainerdVersionInfo | None
    files: ContainerdConfigFilesInfo
    dump: DumpInfo | None
    binary_present: bool
    service: ContainerdServiceInfo | None
    platform: ContainerdPlatformInfo
    turn: list[str]  # the mark of a rollout turn cut off on this node (``rollout.parse_turn_mark``), [] if none


class ContainerdNodeState(FactBase[ContainerdNodeStateInfo]):
    """
    Returns in one command what registering the nvidia runtime reads: ``ContainerdVersion``,
    ``ContainerdConfigFiles``, ``ContainerdConfigDump`` of the main config the unit uses,
    whether the runtime ``binary`` exists, ``ContainerdService`` and ``ContainerdPlatform`` (the
    platform that owns containerd, if any), each as those facts return it (``None`` where
    containerd or systemd is missing), and the lines of the mark a rollout turn cut off on this
    node left (a regular file, at most 4 KiB; ``[]`` where there is none).

    + binary: path of the nvidia runtime binary

    .. code:: python

        {"version": {"major": 1, "minor": 7, ...}, "files": {"main_path": "...", ...},
         "dump": {"summary": {...}, "dump": {...}, "warnings": [], "error": None},
         "binary_present": True, "service": {"active_state": "active", ...},
         "platform": {"name": None, "evidence": [], "k0s_managed": None}, "turn": []}
    """

    # Its command and value are its own (sections behind markers); where its value holds these facts:
    parts: ClassVar[dict[str, Part]] = {
        "version": Part(ContainerdVersion),
        "files": Part(ContainerdConfigFiles),
        # of the main config the unit starts containerd with
        "dump": Part(ContainerdConfigDump, from_value=lambda value: {"config_path": value["files"]["main_path"]}),
        "service": Part(ContainerdService),
        "platform": Part(ContainerdPlatform),
    }

    @override
    def command(self, binary: str) -> str:
        has_containerd = "command -v containerd >/dev/null 2>&1"
        return "; ".join(
            [
                marker("version"),
                f"if {has_containerd}; then {VERSION_COMMAND}; fi",
                marker("files"),
                ContainerdConfigFiles().command(),
                marker("dump"),
                f"if {has_containerd}; then {dump_command(_CFG)}; fi",
                marker("binary"),
                f"if [ -e {shlex.quote(binary)} ]; then echo present; fi",
                marker("service"),
                f"if command -v systemctl >/dev/null 2>&1; then {ContainerdService().command()}; fi",
                marker("platform"),
                ContainerdPlatform().command(),
                marker("turn"),
                f"if [ -f {TURN_MARKER} ] && [ ! -L {TURN_MARKER} ]; then head -c {MARKER_BYTES} {TURN_MARKER}; "
                "echo; fi",
            ]
        )

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
            "platform": owning_platform(sections.get("platform", [])),
            "turn": [line for line in sections.get("turn", []) if line.strip()],
        }
