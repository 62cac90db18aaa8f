"""Facts about containerd on a k0s node: its config files, its merged config, its process and its CRI plugin."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.containerd_dump import CriLoaded, parse_cri_loaded, parse_cri_start_log
from pyinfra_gpunode.facts.containerd import (
    CRI_LINES,
    LOG_BYTES,
    VERSION_COMMAND,
    ContainerdVersion,
    DumpInfo,
    _process_dump,
    candidate_dump_command,
    dump_command,
)
from pyinfra_gpunode.k0s import BIN_DIR
from pyinfra_gpunode.platform import K0S_CONFIG, K0S_DROPINS, K0S_SOCKET
from pyinfra_gpunode.sections import MARK, marker, split_sections
from pyinfra_gpunode.versions import ContainerdVersionInfo

FILE_BYTES = 1048576  # at most this much of each config file is read
# Print a platform's containerd config files and processes (shell/platform-containerd.sh).
_PLATFORM_CONTAINERD = shell.script(Path(__file__).parent / "shell" / "platform-containerd.sh")
# Print a platform's CRI plugin start line and ctr's answer (shell/platform-cri.sh).
_PLATFORM_CRI = shell.script(Path(__file__).parent / "shell" / "platform-cri.sh")


def platform_cri_command(bin_dir: str, address: str, *source: str) -> str:
    """What the CRI plugin of a platform's containerd (its binaries in ``bin_dir``) loaded: its start or failure
    line from ``source`` (``"pid", PID``: the journal's lines of that process; ``"log", LOG, OFFSET``: the file's
    last one past that byte), and the CRI plugins' status from ``ctr plugins ls`` on the socket ``address``."""
    return shell.command(
        _PLATFORM_CRI, "gpunode-platform-cri", MARK, CRI_LINES, bin_dir, address, str(LOG_BYTES), *source
    )


class K0sContainerdInfo(TypedDict):
    version: ContainerdVersionInfo | None  # of k0s' containerd binary
    texts: dict[str, str]  # /etc/k0s/containerd.toml and /etc/k0s/containerd.d/*.toml
    modes: dict[str, str]
    dump: DumpInfo | None  # config dump of /etc/k0s/containerd.toml (None: no containerd)
    processes: dict[int, str]  # containerd pid -> the unit it runs in
    links: dict[str, str]  # symbolic links among the drop-in directory and those above it: path -> target


def _decoded(encoded: str) -> str | None:
    try:
        return base64.b64decode(encoded, validate=True).decode(errors="surrogateescape")
    except (binascii.Error, ValueError):
        return None


class K0sContainerd(FactBase[K0sContainerdInfo]):
    """
    Returns what registering the nvidia runtime reads on a k0s node: the version of k0s' containerd
    (``/var/lib/k0s/bin/containerd``, else the one on PATH), the texts and modes of
    ``/etc/k0s/containerd.toml`` and ``/etc/k0s/containerd.d/*.toml`` (1 MiB each at most), the
    node's own ``config dump`` of ``/etc/k0s/containerd.toml`` and every containerd process with the
    unit it runs in. Reads only.

    .. code:: python

        {"version": {"major": 2, "minor": 1, ...},
         "texts": {"/etc/k0s/containerd.toml": "# k0s_managed=true\\n..."},
         "modes": {"/etc/k0s/containerd.toml": "644"},
         "dump": {"summary": {...}, "dump": {...}, "warnings": [], "error": None},
         "processes": {812: "k0sworker.service"}}
    """

    @staticmethod
    def default() -> K0sContainerdInfo:
        return {"version": None, "texts": {}, "modes": {}, "dump": None, "processes": {}, "links": {}}

    @override
    def command(self) -> str:
        return tree_command(BIN_DIR, K0S_CONFIG, K0S_DROPINS)

    @override
    def process(self, output: list[str]) -> K0sContainerdInfo:
        return process_tree(output, lambda path: path == K0S_CONFIG or path.startswith(f"{K0S_DROPINS}/"))


def tree_command(bin_dir: str, config: str, dropins: str, extra: list[str] | None = None) -> str:
    """What ``K0sContainerd`` (and a platform's like fact) runs: the platform's containerd from ``bin_dir``
    first, its version, the texts of ``config`` and ``dropins``/*.toml, the dump of ``config``, the
    containerd processes by unit, then the ``extra`` parts."""
    has_containerd = "command -v containerd >/dev/null 2>&1"
    return "; ".join(
        [
            f'PATH={bin_dir}:"$PATH"; export PATH',
            marker("version"),
            f"if {has_containerd}; then {VERSION_COMMAND}; fi",
            shell.command(_PLATFORM_CONTAINERD, "gpunode-platform-containerd", MARK, config, dropins, str(FILE_BYTES)),
            marker("dump"),
            f"if {has_containerd}; then {dump_command(config)}; fi",
            *(extra or []),
        ]
    )


def process_tree(output: list[str], accepted: Callable[[str], bool]) -> K0sContainerdInfo:
    """``tree_command``'s output parsed; only files whose path is ``accepted`` are kept."""
    sections = split_sections(output)
    version = sections.get("version", [])
    texts: dict[str, str] = {}
    modes: dict[str, str] = {}
    for line in sections.get("files", []):
        mode, _, rest = line.partition(" ")
        path_b64, _, text_b64 = rest.partition(" ")
        path, text = _decoded(path_b64), _decoded(text_b64)
        if path and text is not None and accepted(path):
            texts[path] = text
            modes[path] = mode if mode.isdigit() else "644"
    processes = {}
    for line in sections.get("processes", []):
        pid, _, unit = line.partition(" ")
        if pid.isdigit():
            processes[int(pid)] = unit.strip()
    links = {}
    for line in sections.get("links", []):
        path_b64, _, target_b64 = line.partition(" ")
        path, target = _decoded(path_b64), _decoded(target_b64)
        if path and target is not None:
            links[path] = target.encode(errors="surrogateescape").decode(errors="backslashreplace")
    dump = sections.get("dump", [])
    return {
        "version": ContainerdVersion().process(version) if version else None,
        "texts": texts,
        "modes": modes,
        "dump": _process_dump(dump) if dump else None,
        "processes": processes,
        "links": links,
    }


def candidate_input(main_text: str, dropin_text: str) -> str:
    """``K0sCandidateDump``'s stdin: the main config (imports under /etc/k0s pointing into the stage)
    and our drop-in, base64, a line each."""
    return "".join(base64.b64encode(text.encode()).decode() + "\n" for text in (main_text, dropin_text))


class K0sCandidateDump(FactBase[DumpInfo | None]):
    """
    Returns ``config dump`` (by k0s' own containerd) of the k0s config tree with our drop-in as
    planned: ``/etc/k0s/containerd.toml`` and every ``*.toml`` under ``/etc/k0s/containerd.d`` copied into
    a temporary directory, the drop-in put beside them, removed afterwards. Nothing is written outside
    the stage (a write into ``/etc/k0s/containerd.d`` would restart k0s' containerd). The texts come
    on stdin (``_stdin=candidate_input(main_text, dropin_text)``); import entries that start with
    ``@GPUNODE_STAGE@`` point into the stage.

    + dropin_path: where the drop-in will live on the node

    .. code:: python

        {"summary": {...}, "dump": {...}, "warnings": [], "error": None}
    """

    @override
    def command(self, dropin_path: str) -> str:
        return candidate_command(BIN_DIR, K0S_CONFIG, K0S_DROPINS, dropin_path)

    @override
    def process(self, output: list[str]) -> DumpInfo:
        return _process_dump(output)


def candidate_command(bin_dir: str, config: str, dropins: str, dropin_path: str) -> str:
    """What ``K0sCandidateDump`` (and a platform's like fact) runs: every ``*.toml`` under ``dropins`` copied into
    a stage with ``config`` and the drop-in ``dropin_path`` (both from stdin), dumped by the platform's containerd
    (``bin_dir`` first)."""
    return candidate_dump_command(config, dropin_path, root=dropins, bin_dir=bin_dir)


class CriLoadedFromLog:
    """What ``K0sCriLoaded`` and ``RancherCriLoaded`` share (their commands: ``platform_cri_command``): their
    value where neither a start line nor ``ctr`` answered, and how their output is read."""

    @staticmethod
    def default() -> CriLoaded:
        return {**parse_cri_start_log([]), "error": "no CRI plugin start line and no answer from ctr"}

    def process(self, output: list[str]) -> CriLoaded:
        sections = split_sections(output)
        loaded = parse_cri_loaded(sections.get("journal", []), sections.get("ctr", []))
        return loaded if loaded["source"] else self.default()


class K0sCriLoaded(CriLoadedFromLog, FactBase[CriLoaded]):
    """
    Returns what the CRI plugin of k0s' running containerd (process ``pid``) loaded: its start or
    failure line in the journal (where containerd's own lines reach it under its PID), else the CRI
    plugins' status from ``ctr --address /run/k0s/containerd.sock plugins ls``.

    + pid: the containerd process

    .. code:: python

        {"loaded": True, "runtimes": ["nvidia", "runc"], "default_runtime_name": "runc", "enable_cdi": True,
         "registry_config_path": None, "error": None, "source": "the CRI plugin's start line in the journal"}
    """

    @override
    def command(self, pid: int) -> str:
        return platform_cri_command(BIN_DIR, K0S_SOCKET, "pid", str(int(pid)))
