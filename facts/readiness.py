"""Facts about a GPU node's readiness: the kernel log's Xid lines, containerd's signal restarts, the GPU
Operator's validation markers and the device plugin socket, and everything else the chain needs in one read."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, NotRequired, TypedDict, cast

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.containerd_dump import CriLoaded
from pyinfra_gpunode.containerd_files import resolve_tree
from pyinfra_gpunode.facts._composite import Part, joined_command, part_values
from pyinfra_gpunode.facts.cdi import CdiRefreshInfo, CdiRefreshUnits, CdiSpec, CdiSpecs
from pyinfra_gpunode.facts.containerd import (
    VERSION_COMMAND,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdNodeState,
    ContainerdNodeStateInfo,
    ContainerdService,
    ContainerdVersion,
    _process_dump,
    cri_loaded_command,
    dump_command,
    service_command,
)
from pyinfra_gpunode.facts.driver import NvidiaHostState, NvidiaHostStateInfo
from pyinfra_gpunode.facts.nvml import NvmlInfo, NvmlInfoDict
from pyinfra_gpunode.facts.operator import GpuOperatorInfo, GpuOperatorState
from pyinfra_gpunode.facts.toolkit import NvidiaContainerToolkit, ToolkitInfo
from pyinfra_gpunode.platform import PlatformContainerd, platform_containerd
from pyinfra_gpunode.read_limits import JOURNAL_SECONDS
from pyinfra_gpunode.readiness import DEVICE_PLUGIN_DIR, VALIDATIONS_DIR
from pyinfra_gpunode.sections import marker, split_parts, split_sections

PART = "@@gpunode-readiness:"
_HAS = "command -v {} >/dev/null 2>&1"
_JOURNAL = f"timeout {JOURNAL_SECONDS} journalctl --no-pager -q -o short-iso-precise"

# Print where the kernel's log was read, the count of NVIDIA Xid events and the last ten (shell/xid-events.sh).
XID_SCRIPT = shell.command(shell.script(Path(__file__).parent / "shell" / "xid-events.sh"), "gpunode-xid-events")


def signals_script(unit: str = "containerd.service") -> str:
    """systemd's lines of containerd's unit that say how each daemon ended, and containerd's own shutdown line."""
    return (
        f"if {_HAS.format('journalctl')}; then echo journal; {_JOURNAL} -u {shlex.quote(unit)} -b --since -24h | "
        "grep -E 'Sent signal SIG[A-Z0-9+]* to main process|Main process exited, code=(killed|dumped)|"
        'Scheduled restart job|Deactivated successfully|systemd\\[1\\]: (Starting|Stopping) |msg="Stop CRI service"\' '
        "| tail -n 200; fi"
    )


SIGNALS_SCRIPT = signals_script()
FILE_BYTES = 1048576  # at most this much of each config file of a platform's containerd is read
# Print a platform's containerd config and the *.toml beside it (shell/platform-files.sh).
_PLATFORM_FILES = shell.script(Path(__file__).parent / "shell" / "platform-files.sh")


def platform_script(where: PlatformContainerd) -> str:
    """What the readiness chain reads of a platform's own containerd (k3s, RKE2, k0s), behind markers after
    ``ContainerdNodeState``'s: its binary's version, its config and the ``*.toml`` beside it (as
    ``ContainerdConfigFiles`` prints them), the node's own ``config dump`` of it, and its unit's state."""
    has_containerd = "command -v containerd >/dev/null 2>&1"
    return "; ".join(
        [
            _path(where),
            marker("platform_version"),
            f"if {has_containerd}; then {VERSION_COMMAND}; fi",
            marker("platform_files"),
            shell.command(_PLATFORM_FILES, "gpunode-platform-files", where["config"], where["root"], str(FILE_BYTES)),
            marker("platform_dump"),
            f"if {has_containerd}; then {dump_command(where['config'])}; fi",
            marker("platform_service"),
            "if command -v systemctl >/dev/null 2>&1; then "
            f"{service_command(unit=where['unit'], config_root=where['root'], generated=where['config'])}; fi",
        ]
    )


def _path(where: PlatformContainerd) -> str:
    """The platform's own containerd and ctr before any other on PATH."""
    return f'PATH={":".join(shlex.quote(d) for d in where["bin_dirs"])}:"$PATH"; export PATH'


def with_platform(node: ContainerdNodeStateInfo, lines: list[str]) -> tuple[ContainerdNodeStateInfo, bool]:
    """``node`` with the version, files, dump and service of the platform's containerd where ``lines`` (the
    containerd part) has ``platform_script``'s sections; and whether it had them."""
    sections = split_sections(lines)
    if "platform_files" not in sections:
        return node, False
    files = ContainerdConfigFiles().process(sections["platform_files"])
    root = files["main_path"].rsplit("/", 1)[0]
    files.update(resolve_tree(files["main_path"], files["texts"], root=root))
    # The platform writes its config at each start of its unit, before containerd: never a pending change.
    files["mtimes"].pop(files["main_path"], None)
    version, dump, service = (sections.get(f"platform_{name}", []) for name in ("version", "dump", "service"))
    return {
        **node,
        "version": ContainerdVersion().process(version) if version else None,
        "files": files,
        "dump": _process_dump(dump) if dump else None,
        "service": ContainerdService().process(service) if service else None,
    }, True


VALIDATIONS_SCRIPT = (
    f"if [ -d {VALIDATIONS_DIR} ]; then echo dir; "
    f'for f in {VALIDATIONS_DIR}/*; do if [ -e "$f" ]; then echo "${{f##*/}}"; fi; done; fi'
)
DEVICE_PLUGIN_SCRIPT = (
    f"if [ -d {DEVICE_PLUGIN_DIR} ]; then echo dir; "
    f'for s in {DEVICE_PLUGIN_DIR}/nvidia-*.sock; do if [ -S "$s" ]; then echo "${{s##*/}}"; fi; done; fi'
)

DEV_NODES_SCRIPT = (
    "echo dev; for node in /dev/nvidia* /dev/nvidia-caps/* /dev/dri/*; do "
    'if [ -c "$node" ]; then echo "$node"; fi; done'
)

_SIGNAL = re.compile(r"Sent signal (SIG[A-Z0-9+]+) to main process|code=(?:killed|dumped), status=\d+/(\w+)")
_STARTING = re.compile(r"systemd\[1\]: Starting ")
# systemd stopping the unit, or containerd shutting down on SIGTERM or SIGINT (its CRI plugin stops first).
_STOP_ASKED = re.compile(r'systemd\[1\]: Stopping |msg="Stop CRI service"')


class XidInfo(TypedDict):
    source: str | None  # "journal", "dmesg", or None when neither is readable
    count: int
    lines: list[str]  # the last 10


class ContainerdSignal(TypedDict):
    time: str
    signal: str
    # True: read from a daemon that ended cleanly with no stop asked (no systemd line names the signal)
    inferred: NotRequired[bool]


class ContainerdJournal(TypedDict):
    signals: list[ContainerdSignal]
    restarts: list[str]


class NodeReadinessInfo(TypedDict):
    """``NodeReadiness``'s value."""

    host: NvidiaHostStateInfo
    nvml: NvmlInfoDict | None
    toolkit: ToolkitInfo
    cdi: list[CdiSpec]
    containerd: ContainerdNodeStateInfo
    cri: CriLoaded | None
    xid: XidInfo
    containerd_journal: ContainerdJournal | None
    validations: list[str] | None
    device_plugin: list[str] | None
    dev_nodes: NotRequired[list[str] | None]  # character devices under /dev/nvidia*, /dev/dri (None: not read)
    operator: GpuOperatorInfo
    cdi_refresh: NotRequired[CdiRefreshInfo]  # the toolkit's CDI refresh units and our drop-in for them
    # where a platform runs containerd: its unit (k3s-agent.service, k0sworker.service, ...); absent: containerd.service
    containerd_unit: NotRequired[str]


def parse_xid(lines: list[str]) -> XidInfo:
    source = next((line.partition("=")[2] for line in lines if line.startswith("source=")), None)
    count = next((int(line.partition("=")[2]) for line in lines if line.startswith("count=")), 0)
    return {
        "source": source or None,
        "count": count,
        "lines": [line for line in lines if "NVRM: Xid" in line],
    }


def parse_containerd_journal(lines: list[str]) -> ContainerdJournal | None:
    """Signals sent to containerd's main process and systemd's automatic restarts, oldest first.

    A signal sent with ``kill(2)`` (the GPU Operator's toolkit does so) leaves no line naming it: containerd
    does not handle SIGHUP, so it dies of it, and systemd counts that a clean end ("Deactivated
    successfully", the exit itself logged at debug level only). A daemon seen starting that ends so, with
    no stop asked by systemd and no shutdown of its own (on SIGTERM or SIGINT it stops its CRI plugin
    first), is read as sent SIGHUP (``inferred``)."""
    if "journal" not in lines:
        return None
    signals: list[ContainerdSignal] = []
    restarts: list[str] = []
    asked: bool | None = None  # since the last start seen: whether the daemon was asked to end
    for line in lines:
        moment = line.split(" ", 1)[0]
        match = _SIGNAL.search(line)
        if match:
            name = match.group(1) or match.group(2)
            signals.append({"time": moment, "signal": name if name.startswith("SIG") else f"SIG{name}"})
            asked = True
        elif "Scheduled restart job" in line:
            restarts.append(moment)
        elif _STARTING.search(line):
            asked = False
        elif _STOP_ASKED.search(line):
            asked = True
        elif "Deactivated successfully" in line:
            if asked is False:
                signals.append({"time": moment, "signal": "SIGHUP", "inferred": True})
            asked = None
    return {"signals": signals, "restarts": restarts}


def parse_listing(lines: list[str]) -> list[str] | None:
    """``dir`` then names: the names, or None when the directory does not exist."""
    if "dir" not in lines:
        return None
    return sorted(line.strip() for line in lines if line.strip() and line != "dir")


def parse_dev_nodes(lines: list[str]) -> list[str] | None:
    """``dev`` then the device node paths: the paths, sorted; None when the listing was not printed."""
    if lines[:1] != ["dev"]:
        return None
    return sorted(line.strip() for line in lines[1:] if line.strip())


def _platform(arguments: Mapping[str, Any]) -> PlatformContainerd | None:
    """The platform's containerd ``NodeReadiness`` reads with ``arguments``, None for containerd.service's."""
    return platform_containerd(arguments["platform"], arguments["unit"])


def _containerd_script(arguments: Mapping[str, Any]) -> str:
    containerd = ContainerdNodeState().command(arguments["binary"])
    where = _platform(arguments)
    return f"{containerd}; {platform_script(where)}" if where else containerd


def _cri_script(arguments: Mapping[str, Any]) -> str:
    where = _platform(arguments)
    cri = ContainerdCriLoaded().command()
    if where:
        cri = f"{_path(where)}; {cri_loaded_command(address=where['socket'], unit=where['unit'], log=where['log'])}"
    return f"if {_HAS.format('journalctl')} && {_HAS.format('systemctl')}; then echo journal; {cri}; fi"


def _signals_script(arguments: Mapping[str, Any]) -> str:
    where = _platform(arguments)
    return signals_script(where["unit"]) if where else SIGNALS_SCRIPT


class NodeReadiness(FactBase[NodeReadinessInfo]):
    """
    Returns in one command everything the readiness chain reads: ``NvidiaHostState`` (PCI,
    driver, Fabric Manager), ``NvmlInfo``, ``NvidiaContainerToolkit``, ``CdiSpecs``,
    ``ContainerdNodeState`` and ``ContainerdCriLoaded`` (each as those facts return it; ``cri``
    is None without a journal), plus the kernel log's ``NVRM: Xid`` lines since boot (journal,
    else ``dmesg``; ``source`` None when neither is readable), the signals sent to containerd (a
    SIGHUP sent with ``kill``, which no line names, read from a clean end nobody asked for) and
    systemd's automatic restarts of it in the last 24 hours of this boot, the GPU Operator
    validator's markers in ``/run/nvidia/validations`` (None when it has not run) and the NVIDIA
    device plugin sockets in ``/var/lib/kubelet/device-plugins`` (None without that directory),
    the character devices ``/dev/nvidia*``, ``/dev/nvidia-caps/*``, ``/dev/dri/*`` that exist,
    and what the GPU Operator left on the node (``GpuOperatorState``: its toolkit, driver
    container root, validator markers and containerd drop-in).

    + binary: path of the nvidia runtime binary
    + cdi_dirs: further CDI spec directories to read (containerd's ``cdi_spec_dirs``)
    + platform, unit: the platform that owns containerd and the unit it runs containerd in
      (``ContainerdPlatform``'s ``name`` and ``unit``): on k3s, RKE2 and k0s the version, config files,
      ``config dump``, unit state, CRI plugin (journal of that unit, else ``ctr`` on the platform's
      socket) and signals are those of the platform's containerd (``/var/lib/rancher/<program>/agent/etc/
      containerd/config.toml`` or ``/etc/k0s/containerd.toml``), not containerd.service's;
      ``containerd_unit`` names the unit read (absent where containerd.service was)

    .. code:: python

        {
            "host": {"pci": {"gpus": [...], ...}, "driver": {...}, "fabric_manager": {...}, ...},
            "nvml": {"driver_version": "580.159.04", "error": None, ...},
            "toolkit": {"ctk_version": "1.17.8", ...},
            "cdi": [{"path": "/etc/cdi/nvidia.yaml", "driver_version": "580.159.04", ...}],
            "containerd": {"version": {...}, "files": {...}, "dump": {...}, "service": {...}, ...},
            "cri": {"loaded": True, "runtimes": ["nvidia", "runc"], ...},
            "xid": {"source": "journal", "count": 0, "lines": []},
            "containerd_journal": {"signals": [{"time": "2026-12-01T00:45:12.4+00:00",
                                                "signal": "SIGHUP"}], "restarts": ["..."]},
            "validations": ["driver-ready", "toolkit-ready"],
            "device_plugin": ["nvidia-gpu.sock"],
            "dev_nodes": ["/dev/nvidia0", "/dev/nvidiactl"],
            "operator": {"toolkit_binaries": [], "driver_root_library": None, "validations": None,
                         "driver_ready": {}, "dropin": None},
        }
    """

    parts: ClassVar[dict[str, Part]] = {
        "host": Part(NvidiaHostState),
        "nvml": Part(NvmlInfo),
        "toolkit": Part(NvidiaContainerToolkit),
        "cdi": Part(CdiSpecs, lambda arguments: {"dirs": arguments["cdi_dirs"]}),
        # a platform's containerd (k3s, RKE2, k0s) is not what ContainerdNodeState and ContainerdCriLoaded read
        "containerd": Part(
            ContainerdNodeState,
            lambda arguments: None if _platform(arguments) else {"binary": arguments["binary"]},
            script=_containerd_script,
        ),
        "cri": Part(
            ContainerdCriLoaded,
            lambda arguments: None if _platform(arguments) else {},
            script=_cri_script,
            read=lambda lines: ContainerdCriLoaded().process(lines[1:]) if lines[:1] == ["journal"] else None,
            none_unread=True,  # no journal
        ),
        "xid": Part(script=lambda arguments: XID_SCRIPT, read=parse_xid),
        "containerd_journal": Part(script=_signals_script, read=parse_containerd_journal),
        "validations": Part(script=lambda arguments: VALIDATIONS_SCRIPT, read=parse_listing),
        "device_plugin": Part(script=lambda arguments: DEVICE_PLUGIN_SCRIPT, read=parse_listing),
        "dev_nodes": Part(script=lambda arguments: DEV_NODES_SCRIPT, read=parse_dev_nodes),
        "operator": Part(GpuOperatorState),
        "cdi_refresh": Part(CdiRefreshUnits),
    }

    @override
    def command(
        self, binary: str, cdi_dirs: list[str] | None = None, platform: str | None = None, unit: str | None = None
    ) -> str:
        arguments = {"binary": binary, "cdi_dirs": cdi_dirs, "platform": platform, "unit": unit}
        return joined_command(PART, self.parts, arguments) + "; true"

    @override
    def process(self, output: list[str]) -> NodeReadinessInfo:
        sections = split_parts(output, PART, self.parts)
        info = cast(NodeReadinessInfo, part_values(self.parts, sections))
        containerd, owned = with_platform(info["containerd"], sections["containerd"])
        info["containerd"] = containerd
        unit = containerd["platform"]["unit"]
        if owned and unit:
            info["containerd_unit"] = unit
        return info
