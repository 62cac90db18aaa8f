"""Register the nvidia runtime with containerd's CRI plugin, safely on containerd 1.6, 1.7 and 2.x."""

from __future__ import annotations

import difflib
import inspect
import posixpath
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation
from pyinfra.facts.files import File

from pyinfra_gpunode import k0s, rancher, shell
from pyinfra_gpunode.containerd_dropin import MODES, OUR_DROPIN, Options, Plan, plan, same_meaning, staged_imports
from pyinfra_gpunode.containerd_dump import (
    CriLoaded,
    candidate_losses,
    expected_after_restart,
    nri_losses,
    restart_problem,
    runc_runtime,
    summarize,
)
from pyinfra_gpunode.containerd_files import (
    CONFIG_ROOT,
    ConfigTree,
    links_in_the_way,
    load_order,
    missing_imports,
    not_regular_files,
    resolve_tree,
    strictest_mode,
)
from pyinfra_gpunode.cri_rules import cri_start_findings, import_findings, stopping
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdNodeState,
    ContainerdService,
    ContainerdServiceInfo,
    DumpInfo,
    candidate_input,
    cri_address,
)
from pyinfra_gpunode.facts.k0s import K0sCandidateDump, K0sContainerd
from pyinfra_gpunode.facts.k0s import candidate_input as k0s_candidate_input
from pyinfra_gpunode.facts.rancher import RancherCandidateDump, RancherContainerd, RancherContainerdInfo
from pyinfra_gpunode.log import logger, printable
from pyinfra_gpunode.operations._atomic import fail, write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import DEFAULT_BINARY, decided_once, facts_unchanged, node_fact
from pyinfra_gpunode.operator import handler_problem
from pyinfra_gpunode.platform import (
    K0S_CONFIG,
    K0S_DROPINS,
    ContainerdPlatformInfo,
    rancher_config,
    rancher_note,
    rancher_nvidia,
    rancher_restart_reason,
    rancher_unapplied,
    runtime_requests,
)
from pyinfra_gpunode.platform import refusal as platform_refusal
from pyinfra_gpunode.redaction import redacted
from pyinfra_gpunode.rollout import TurnMark, parse_turn_mark
from pyinfra_gpunode.settings import CONTAINERD_MODE, DROPIN_DIR, RESTART_TIMEOUT, RUNTIME_BINARY, RUNTIME_HANDLER

BACKUP_DIR = "/var/lib/pyinfra-gpunode/backup"  # mode 0700: the files can carry registry credentials
FAILED_DIR = "/var/lib/pyinfra-gpunode/failed"  # mode 0700, like the backups


def _check_absolute(name: str, value: str) -> None:
    if not value.startswith("/"):
        raise OperationValueError(f"{name} must be an absolute path, got {value!r}")


@dataclass
class Registration:
    """The node's containerd config measured against the nvidia runtime registration."""

    problem: str | None = None  # why nothing may be written
    installed: bool = True
    writes: dict[str, str] = field(default_factory=dict)  # path -> new text
    current: dict[str, str] = field(default_factory=dict)  # path -> text on the node
    modes: dict[str, str] = field(default_factory=dict)  # path -> mode it is written with
    owners: dict[str, str] = field(default_factory=dict)  # path -> owner:group it is written with
    service: ContainerdServiceInfo | None = None
    # Runtimes the written files no longer define because the file defining them was removed.
    dropped_runtimes: list[str] = field(default_factory=list)
    restart_reason: str | None = None  # why the running daemon must be restarted (``restart_reason``)
    # Why the node's config as it is now would not start the CRI plugin (``cri_start_problem``).
    current_cri_problem: str | None = None
    # k3s or RKE2, which add the nvidia runtime themselves: nothing is written, their unit restarted.
    platform: ContainerdPlatformInfo | None = None
    note: str | None = None  # what the step says when it has nothing to write
    # The mark of a rollout turn an earlier run began here and did not end, and why its content was not used.
    turn_mark: TurnMark | None = None
    turn_mark_problem: str | None = None
    mode_line: str | None = None  # NRI mode: what the plan says of it

    @property
    def restart_pending(self) -> bool:
        return self.restart_reason is not None

    def _mode_note(self, path: str) -> str:
        mode = self.modes.get(path, "644")
        return "" if mode == "644" else f", mode {mode}"

    def diff(self) -> str:
        """The planned changes as a unified diff, credential values redacted."""
        return "".join(
            "".join(
                difflib.unified_diff(
                    redacted(self.current.get(path, "")).splitlines(keepends=True),
                    redacted(text).splitlines(keepends=True),
                    fromfile=f"{path} (node)",
                    tofile=f"{path} (planned{self._mode_note(path)})",
                )
            )
            for path, text in self.writes.items()
        )


def registration(**arguments: Any) -> Registration:
    """Read the node's containerd facts and judge the planned files (``nvidia_runtime``'s arguments), with
    the mark of a rollout turn an earlier run left unfinished on the node: once per node read (the candidate
    config is staged and judged once), whether the plan, the rollout or the step asks."""
    bound = inspect.signature(_registration).bind(**arguments)
    bound.apply_defaults()
    _check_arguments(**bound.arguments)
    node = node_fact(ContainerdNodeState, binary=bound.arguments["binary"])

    def judged() -> Registration:
        found = _registration(**bound.arguments)
        found.turn_mark, found.turn_mark_problem = parse_turn_mark(node.get("turn", []))
        return found

    return decided_once("registration", node, repr(sorted(bound.arguments.items())), judged)


def _check_arguments(mode: str, binary: str, dropin_dir: str, cdi_spec_dirs: list[str] | None, **_: Any) -> None:
    """Refuse arguments no node could take, naming the argument, before anything is read."""
    if mode not in MODES:
        raise OperationValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    _check_absolute("binary", binary)
    _check_absolute("dropin_dir", dropin_dir)
    for spec_dir in cdi_spec_dirs or []:
        _check_absolute("cdi_spec_dirs entry", spec_dir)


def _registration(
    binary: str = DEFAULT_BINARY,
    systemd_cgroup: bool | None = None,
    default_runtime: bool = False,
    cdi_spec_dirs: list[str] | None = None,
    dropin_dir: str = DROPIN_DIR,
    binary_required: bool = False,
    enable_cdi: bool | None = None,
    handler: str = RUNTIME_HANDLER,
    mode: str = CONTAINERD_MODE,
    enable_nri: bool | None = None,
) -> Registration:
    node = node_fact(ContainerdNodeState, binary=binary)
    owned = platform_refusal(node.get("platform"))  # k3s, RKE2, k0s, EKS nodeadm: their config, not ours
    if owned:
        return Registration(owned)
    if rancher_nvidia(node.get("platform")):
        requests = runtime_requests(
            binary=binary, handler=handler, systemd_cgroup=systemd_cgroup, default_runtime=default_runtime,
            enable_cdi=enable_cdi, cdi_spec_dirs=cdi_spec_dirs, mode=mode, enable_nri=enable_nri,
        )  # fmt: skip
        tree = _rancher_tree(node["platform"])  # read once: refusal, our drop-in, the plan all use it
        refused = rancher_refusal(node["platform"], requests, tree)
        if refused:
            return Registration(refused)
        written = tree is not None and rancher.dropin_path(node["platform"]["name"] or "") in tree["texts"]
        if tree is not None and (rancher_unapplied(node["platform"], requests) or written):
            return _rancher_dropin_registration(node["platform"], requests, handler, tree)
        return _rancher_registration(node["platform"])
    if (node.get("platform") or {}).get("name") == "k0s":
        k0s_options = Options(
            binary=binary,
            systemd_cgroup=systemd_cgroup,
            default_runtime=default_runtime,
            cdi_spec_dirs=None if cdi_spec_dirs is None else tuple(cdi_spec_dirs),
            enable_cdi=enable_cdi,
            mode=mode,
            enable_nri=enable_nri,
        )
        return _k0s_registration(node["platform"], k0s_options, handler, binary_required, node["binary_present"])
    version, files, before = node["version"], node["files"], node["dump"]
    if not version:
        return Registration(
            "containerd is not installed: install it before registering the nvidia runtime", installed=False
        )
    not_files = not_regular_files([files["main_path"], OUR_DROPIN], files["kinds"])
    if not_files:
        return Registration(
            "containerd config not changed: "
            + "; ".join(not_files)
            + ": gpunode writes regular files only; move it away or replace it with a file"
        )
    options = Options(
        binary=binary,
        systemd_cgroup=systemd_cgroup,
        default_runtime=default_runtime,
        cdi_spec_dirs=None if cdi_spec_dirs is None else tuple(cdi_spec_dirs),
        dropin_dir=dropin_dir.rstrip("/"),
        enable_cdi=enable_cdi,
        mode=mode,
        enable_nri=enable_nri,
    )
    before_dump = before["dump"] if before else {}
    current_cri_problem = cri_start_problem(before, files["main_path"], files["texts"])
    result = plan(files["main_path"], files["texts"], version, options, runc_runtime(before_dump))
    if result.errors:
        return Registration("containerd config not changed: " + "; ".join(result.errors))
    for warning in result.warnings:
        logger.warning("%s%s", host.print_prefix, warning)
    for line in result.dropped_lines:
        logger.info("%s%s", host.print_prefix, line)
    nri = mode == "nri"
    mode_line = result.mode_line or None

    if not node["binary_present"] and not nri:  # NRI mode runs no nvidia runtime binary
        message = f"nvidia runtime binary {binary} is missing on the node"
        if binary_required:
            return Registration(f"containerd config not changed: {message} (gpunode_runtime_binary_required)")
        if default_runtime:
            return Registration(
                f"containerd config not changed: {message}, and making nvidia the default "
                "runtime (gpunode_nvidia_default_runtime) would fail every pod without a "
                "RuntimeClass: install the runtime first"
            )
        logger.warning(
            "%s%s; containers using the nvidia runtime will fail until it is installed", host.print_prefix, message
        )

    # A written file keeps its mode, owner and group; ours is as strict as the files whose keys it
    # carries (registry credentials), never looser than it is.
    modes = {
        result.config_path: files["modes"].get(result.config_path, "644"),
        OUR_DROPIN: strictest_mode(
            [files["modes"][path] for path in result.sources if path in files["modes"]],
            base=files["modes"].get(OUR_DROPIN, "644"),
        ),
    }
    # The drop-in first: config.toml imports it by name, and containerd (1.6 to 2.x) does not start on a
    # config that names a missing file, so a run cut off between the two writes leaves one that still starts.
    writes = {
        path: text
        for path, text in ((OUR_DROPIN, result.dropin_text), (result.config_path, result.config_text))
        if not same_meaning(path, files["texts"].get(path), text)
        or files["modes"].get(path, modes[path]) != modes[path]
    }
    current = {path: files["texts"][path] for path in writes if path in files["texts"]}
    if not writes:
        summary = before["summary"] if before and not before["error"] else None
        problem = (
            handler_problem(summary["runtimes"], handler, binary)
            if summary and handler != "nvidia" and not nri
            else None
        )
        return Registration(
            "containerd config not changed: " + problem if problem else None,
            service=node["service"],
            restart_reason=restart_reason(node["service"], node["dump"]),
            current_cri_problem=current_cri_problem,
            mode_line=mode_line,
        )
    links = links_in_the_way(list(writes), files["links"])
    if links:
        return Registration(
            "containerd config not changed: "
            + "; ".join(links)
            + ": gpunode writes real files only, never through a link; "
            "replace the link with the file or directory it points to"
        )

    after = host.get_fact(
        ContainerdCandidateDump,
        config_path=result.config_path,
        dropin_path=OUR_DROPIN,
        _stdin=candidate_input(staged_imports(result.config_text), result.dropin_text),
    )
    found = Registration(
        writes=writes,
        current=current,
        modes={path: modes[path] for path in writes},
        owners={path: files["owners"].get(path, "root:root") for path in writes},
        current_cri_problem=current_cri_problem,
        mode_line=mode_line,
    )
    candidate_tree = resolve_tree(
        result.config_path, {**files["texts"], result.config_path: result.config_text, OUR_DROPIN: result.dropin_text}
    )
    found.problem = _candidate_problem(before, after, candidate_tree, result, binary, handler, nri)
    if found.problem:
        return found
    assert after is not None and after["summary"] is not None  # a dump without an error has its summary
    found.service = node["service"]
    found.restart_reason = restart_reason(node["service"], node["dump"])
    found.dropped_runtimes = sorted(set(summarize(before_dump)["runtimes"]) - set(after["summary"]["runtimes"]))
    return found


def _k0s_registration(
    info: ContainerdPlatformInfo, options: Options, handler: str, binary_required: bool, binary_present: bool
) -> Registration:
    """A k0s node whose ``/etc/k0s/containerd.toml`` k0s manages: our drop-in in ``/etc/k0s/containerd.d``,
    planned as on containerd 2.x (version 3, plugin ``io.containerd.cri.v1.runtime``) and judged by k0s'
    own containerd on a staged copy of its tree, never written here (the write restarts k0s' containerd:
    ``platform.runtime_dropin_applied`` writes it in the node's turn)."""
    node = host.get_fact(K0sContainerd)
    layout = k0s.layout_problem(node["version"], node["texts"])
    if layout:
        return Registration(k0s.refusal(info["evidence"], layout), platform=info)
    version, texts, before = node["version"], node["texts"], node["dump"]
    assert version is not None  # layout_problem refuses a node without k0s' containerd
    if before is None or before["error"]:
        error = before["error"] if before else "no dump"
        return Registration(f"containerd config not changed: k0s' containerd does not load {K0S_CONFIG}: {error}")
    mine = k0s.options(options)
    result = plan(K0S_CONFIG, texts, version, mine, runc_runtime(before["dump"]))
    errors = result.errors or k0s.dropin_problems(result.dropin_text)
    if errors:
        return Registration("containerd config not changed: " + "; ".join(errors), platform=info)
    for warning in result.warnings:
        logger.warning("%s%s", host.print_prefix, warning)
    nri = options.mode == "nri"
    if not binary_present and not nri:
        message = f"nvidia runtime binary {options.binary} is missing on the node"
        if binary_required or options.default_runtime:
            return Registration(f"containerd config not changed: {message}", platform=info)
        logger.warning(
            "%s%s; containers using the nvidia runtime will fail until it is installed", host.print_prefix, message
        )
    current_cri_problem = cri_start_problem(before, K0S_CONFIG, texts, k0s.ROOT)
    mode = strictest_mode([], base=node["modes"].get(k0s.DROPIN, "644"))
    # Our drop-in compared as ``containerd.nvidia_runtime`` compares its own: account lines do not count.
    if same_meaning(OUR_DROPIN, texts.get(k0s.DROPIN), result.dropin_text):
        summary = before["summary"]
        problem = handler_problem(summary["runtimes"], handler, options.binary) if summary and not nri else None
        return Registration(
            "containerd config not changed: " + problem if problem else None,
            platform=info,
            current_cri_problem=current_cri_problem,
            mode_line=result.mode_line or None,
        )
    main = staged_imports(texts[K0S_CONFIG], root=k0s.ROOT)
    after = host.get_fact(
        K0sCandidateDump, dropin_path=k0s.DROPIN, _stdin=k0s_candidate_input(main, result.dropin_text)
    )
    candidate_tree = resolve_tree(K0S_CONFIG, {**texts, k0s.DROPIN: result.dropin_text}, k0s.ROOT)
    found = Registration(
        writes={k0s.DROPIN: result.dropin_text},
        current={k0s.DROPIN: texts[k0s.DROPIN]} if k0s.DROPIN in texts else {},
        modes={k0s.DROPIN: mode},
        owners={k0s.DROPIN: "root:root"},
        platform=info,
        current_cri_problem=current_cri_problem,
        mode_line=result.mode_line or None,
        note=k0s.write_line(info["unit"]),
    )
    found.problem = _candidate_problem(before, after, candidate_tree, result, options.binary, handler, nri)
    return found


def _candidate_problem(
    before: DumpInfo | None,
    after: DumpInfo | None,
    candidate_tree: ConfigTree,
    result: Plan,
    binary: str,
    handler: str,
    nri: bool,
) -> str | None:
    """Why the candidate tree (merged by the node's own containerd as ``after``) may not be written: it does
    not load, the CRI plugin's start rules refuse it, it loses what the node has now (``before``), or the
    handler's runtime is not ``binary``; ``None`` when it may."""
    if after is None or after["error"]:
        return (
            "containerd config not changed: containerd rejects the candidate config: "
            f"{after['error'] if after else 'no dump'}"
        )
    refused = cri_start_findings(after["dump"], load_order(candidate_tree))
    if refused:
        return "containerd config not changed: by the CRI plugin's start rules, the candidate config: " + (
            "; ".join(finding.message for finding in refused)
        )
    losses = candidate_losses(
        before["dump"] if before else {},
        after["dump"],
        before["warnings"] if before else [],
        after["warnings"],
        result.intended,
        binary,
        result.user_set,
        result.dropped,
        runtime_expected=not nri,
    ) + nri_losses(after["dump"], result.nri_expected, result.nri_user_set)
    if losses:
        problem = "containerd config not changed: the candidate would lose: " + "; ".join(losses)
        if result.provenance_unknown:
            problem += (
                f" ({result.dropin_path} does not record which file each key it carries came from, so a "
                "removed drop-in cannot be told from a loss: put the drop-in back, run once, then "
                "remove it again)"
            )
        return problem
    assert after["summary"] is not None  # a dump without an error has its summary
    handler_missing = None if nri else handler_problem(after["summary"]["runtimes"], handler, binary)
    return "containerd config not changed: " + handler_missing if handler_missing else None


def rancher_refusal(
    info: ContainerdPlatformInfo | None, requests: Mapping[str, object], tree: RancherContainerdInfo | None = None
) -> str | None:
    """Why a k3s or RKE2 node whose agent adds the nvidia runtime itself is refused for host data it asks
    beyond that (``platform.rancher_unapplied``), or ``None``: also where a drop-in in the agent's
    ``config-v3.toml.d`` applies it all (the agent's containerd 2.x, its generated config version 3
    importing that directory, nvidia already in it, no binary other than the one the agent finds).
    ``tree``: the ``RancherContainerd`` read the caller has (read here where it has none)."""
    unapplied = rancher_unapplied(info, requests)
    if not unapplied or not info or rancher_nvidia(info) != "present" or not rancher.appliable(requests, info):
        return unapplied
    program = info["name"] or ""
    node = tree or host.get_fact(RancherContainerd, program=program)
    layout = rancher.layout_problem(node["version"], node["texts"].get(rancher_config(program)), program)
    return unapplied if layout else None


def _rancher_tree(info: ContainerdPlatformInfo | None) -> RancherContainerdInfo | None:
    """The agent's containerd files, dump and processes, where it adds the nvidia runtime itself (only then
    can a drop-in of ours apply, or one an earlier run left be planned again); else ``None``."""
    if not info or rancher_nvidia(info) != "present":
        return None
    return host.get_fact(RancherContainerd, program=info["name"] or "")


def _rancher_dropin_registration(
    info: ContainerdPlatformInfo, requests: dict[str, object], handler: str, node: RancherContainerdInfo
) -> Registration:
    """A k3s or RKE2 node whose agent adds the nvidia runtime itself and host data asks for more
    (``requests``), where a drop-in applies it (``rancher_refusal``): our drop-in in the agent's
    ``config-v3.toml.d`` with only the keys asked, judged by the agent's own containerd on a staged copy of
    the generated config and the directory, never written here (it takes a restart of the agent's unit:
    ``platform.runtime_dropin_applied`` writes it in the node's turn)."""
    program = info["name"] or ""
    config, path = rancher_config(program), rancher.dropin_path(program)
    texts, before = node["texts"], node["dump"]
    if before is None or before["error"]:
        error = before["error"] if before else "no dump"
        return Registration(f"containerd config not changed: {program}'s containerd does not load {config}: {error}")
    if config not in texts:  # unreadable, or over the read's size bound
        return Registration(f"containerd config not changed: {config} could not be read", platform=info)
    table = rancher.dropin_table(requests, info, texts[config])
    text = rancher.render(table, info)
    current_cri_problem = cri_start_problem(before, config, texts, rancher.etc_dir(program))
    if texts.get(path) == text:
        return Registration(
            platform=info, note=rancher.applied_note(info, table), current_cri_problem=current_cri_problem
        )
    main = staged_imports(texts[config], root=rancher.etc_dir(program))
    after = host.get_fact(RancherCandidateDump, program=program, _stdin=k0s_candidate_input(main, text))
    candidate_tree = resolve_tree(config, {**texts, path: text}, rancher.etc_dir(program))
    found = Registration(
        writes={path: text},
        current={path: texts[path]} if path in texts else {},
        modes={path: strictest_mode([], base=node["modes"].get(path, "644"))},
        owners={path: "root:root"},
        platform=info,
        current_cri_problem=current_cri_problem,
        note=rancher.write_line(info, table),
    )
    dropped = rancher.dropped_keys(rancher.written_table(texts.get(path)), table, path)
    judged = Plan(
        config_path=config, dropin_path=path, dropin_text=text, intended=rancher.intended(table), dropped=dropped
    )
    assert info["toolkit"] is not None  # rancher_nvidia says present
    found.problem = _candidate_problem(before, after, candidate_tree, judged, info["toolkit"], handler, False)
    unshown = rancher.unshown(after["dump"], table, path) if after and not found.problem else []
    if unshown:
        found.problem = "containerd config not changed: the candidate config does not show " + "; ".join(unshown)
    return found


def _rancher_registration(info: ContainerdPlatformInfo) -> Registration:
    """k3s or RKE2 add the nvidia runtime themselves: nothing to write; their unit restarted where
    their generated config lacks it yet."""
    if rancher_nvidia(info) == "present":
        return Registration(platform=info, note=rancher_note(info))
    return Registration(platform=info, restart_reason=rancher_restart_reason(info))


@operation()
@locked_before_changes
def nvidia_runtime(
    binary: str = RUNTIME_BINARY,
    systemd_cgroup: bool | None = None,
    default_runtime: bool = False,
    cdi_spec_dirs: list[str] | None = None,
    dropin_dir: str = DROPIN_DIR,
    binary_required: bool = False,
    enable_cdi: bool | None = None,
    handler: str = RUNTIME_HANDLER,
    mode: str = CONTAINERD_MODE,
    enable_nri: bool | None = None,
) -> Generator[Any, Any, None]:
    """
    Register the nvidia runtime with containerd's CRI plugin through a drop-in that survives
    other drop-ins (or, in NRI mode, turn on containerd's NRI and CDI without a runtime).

    + binary: ``BinaryName`` of the nvidia runtime (absolute path)
    + systemd_cgroup: ``SystemdCgroup`` of the nvidia runtime; ``None`` keeps what a file sets
      for nvidia, else as the default runtime has it
    + default_runtime: make nvidia the default runtime (otherwise the default is unchanged);
      refused while ``binary`` is missing on the node
    + cdi_spec_dirs: CDI spec directories (containerd 1.7 and 2.x); ``None`` keeps what a file
      sets, else ``["/etc/cdi", "/var/run/cdi"]``
    + dropin_dir: the user's drop-in directory; config.toml's ``imports`` is made to cover
      ``<dropin_dir>/*.toml``
    + binary_required: fail (instead of warn) when ``binary`` is missing on the node
    + enable_cdi: ``enable_cdi`` (containerd 1.7 and 2.x); ``None`` keeps what a file sets, else on
    + handler: the runtime name the cluster's RuntimeClass uses; the candidate config must have a
      runtime of that name whose ``BinaryName`` is ``binary``, else the host fails naming it
    + mode: ``runtime`` registers the nvidia runtime; ``nri`` registers none and turns on
      containerd's NRI plugin and CDI (containerd 1.7 and later), for the GPU Operator's NRI plugin
    + enable_nri: NRI mode: ``None`` keeps a file's ``disable`` for the NRI plugin (the plan says NRI
      stays off), ``True`` turns NRI on whatever the files set; else on

    The nvidia runtime is a copy of the default runtime's entry (options, ``base_runtime_spec``,
    sandbox settings…) with ``binary`` as its ``BinaryName``; a value a file sets for a key
    written here is kept unless an argument names another, and the plan says which.

    config.toml is created if missing, and its ``imports`` is edited with comments kept so it
    covers the drop-in directory and ends with ``/etc/containerd/gpunode/nvidia-runtime.toml``,
    which therefore loads after every user drop-in. On containerd 1.6/1.7 that file carries
    the whole CRI section as the other files mean it (a partly defined runc with the
    ``runtime_type``/``sandbox_mode`` containerd fills in); on 2.x only the keys it owns.
    A file that exists keeps its owner, group and mode (config.toml's mode as it is); our file
    is made as strict as the files whose keys it carries (a 0600 drop-in with registry
    credentials makes it 0600), never looser. A new file is root's, mode 0644 (or stricter,
    as above). A config.toml or directory on the way that is a symbolic link is refused,
    naming it, and so is anything but a regular file at a path it writes (a directory named
    ``nvidia-runtime.toml``) or anything but a directory above one.

    Before anything is written the whole candidate tree is staged in a temporary directory on
    the node and judged by the node's own ``containerd config dump``: nvidia present, every
    runtime present before still present, the default runtime defined, a value a user's file
    sets kept, every other CRI key unchanged and no new warning. On 1.6/1.7 our file records
    which file each key it carries came from; a key whose file was removed (or no longer sets
    it) is dropped as the user's intent and the plan says so. Otherwise the host fails with
    what would have been lost (credential values redacted) and nothing changes. Take a backup
    first with ``config_backed_up`` (the rollout does, at each node's turn). containerd is not
    restarted: a restart is pending until it is (see ``ContainerdService``).

    In NRI mode nothing of the above concerns a runtime: the file writes ``enable_cdi`` (and
    ``cdi_spec_dirs``) by the same rule, and ``disable = false`` for ``io.containerd.nri.v1.nri`` where no
    file sets it (on 1.7 with every other file's NRI keys, as it carries the CRI section); an
    nvidia runtime our previous file registered is dropped, the plan says so, and the gate holds
    the candidate to NRI on and to every NRI key a file sets. ``binary`` and ``handler`` are not
    checked then.

    On a k0s node (``/etc/k0s/containerd.toml`` managed by k0s 1.36 or later) the file is
    ``/etc/k0s/containerd.d/nvidia-gpunode.toml`` (version 3, ``io.containerd.cri.v1.runtime``),
    judged the same way by k0s' containerd; since k0s restarts its containerd when it changes, this
    step never writes it and fails the node instead: the rollout writes it in the node's turn
    (``platform.runtime_dropin_applied``).

    On a k3s or RKE2 node whose agent finds the toolkit's ``nvidia-container-runtime`` (and so adds
    the nvidia runtime itself) nothing is written, and the step says where the runtime was found;
    while the generated config lacks it, the rollout restarts the agent's unit instead
    (``platform.unit_restarted``). What the arguments ask beyond the agent's runtime goes, on
    containerd 2.x with a version-3 generated config, into
    ``/var/lib/rancher/<program>/agent/etc/containerd/config-v3.toml.d/90-gpunode-nvidia.toml``,
    judged by the agent's containerd; since it takes effect only when the agent's unit restarts, this
    step fails the node instead of writing it: the rollout writes it in the node's turn
    (``platform.runtime_dropin_applied``).

    **Example:**

    .. code:: python

        containerd.nvidia_runtime(
            name="Register the nvidia runtime",
            binary="/usr/bin/nvidia-container-runtime",
        )
    """
    found = registration(
        binary=binary,
        systemd_cgroup=systemd_cgroup,
        default_runtime=default_runtime,
        cdi_spec_dirs=cdi_spec_dirs,
        dropin_dir=dropin_dir,
        binary_required=binary_required,
        enable_cdi=enable_cdi,
        handler=handler,
        mode=mode,
        enable_nri=enable_nri,
    )
    if not found.installed and not state.is_executing:
        host.noop("containerd is not installed yet; the runtime is registered once it is")
        return
    if found.problem:
        yield fail(found.problem)
        return
    if not found.writes:
        if found.note and state.is_executing:  # k3s or RKE2 adding nvidia themselves
            logger.info("%s%s", host.print_prefix, found.note)
        host.noop(found.note or found.mode_line or "containerd runtime nvidia is registered")
        return
    if found.platform and found.platform["name"] == "k0s":
        yield fail(
            f"containerd config not changed: k0s restarts its containerd as soon as a file in {K0S_DROPINS}/ "
            "changes, so the write is a restart: gpunode writes it only in the node's rollout turn "
            "(gpunode_containerd_restart: rolling), never as a file-only step"
        )
        return
    if found.platform:  # k3s or RKE2: the drop-in takes effect when the agent's unit restarts
        yield fail(
            f"containerd config not changed: {', '.join(found.writes)} takes effect only when "
            f"{found.platform['unit']} restarts (the kubelet with it), so gpunode writes it only in the node's "
            "rollout turn, with that restart (gpunode_containerd_restart: rolling), never as a file-only step"
        )
        return
    for path, text in found.writes.items():
        user, _, group = found.owners.get(path, "root:root").partition(":")
        yield from write_file(path, text, mode=found.modes[path], user=user, group=group)
    if state.is_executing:
        if found.mode_line:
            logger.info("%s%s", host.print_prefix, found.mode_line)
        logger.info("%scontainerd restart pending: %s", host.print_prefix, ", ".join(found.writes))


def cri_start_problem(
    dump: DumpInfo | None, main_path: str, texts: dict[str, str], root: str = CONFIG_ROOT
) -> str | None:
    """Why the config tree ``texts`` (merged as ``dump``) would keep the CRI plugin from starting, by the
    plugin's own start rules, or ``None`` (also where containerd is missing, or the files do not load for
    another reason than an ``imports`` entry naming a missing file: containerd 1.x's dump fails on that)."""
    if not dump:
        return None
    missing = missing_imports(main_path, texts, root)
    if dump["error"]:
        return stopping(import_findings(missing))
    return stopping(cri_start_findings(dump["dump"], load_order(resolve_tree(main_path, texts, root)), missing))


def restart_reason(service: ContainerdServiceInfo | None, dump: DumpInfo | None) -> str | None:
    """
    Why containerd must be restarted and verified now, or ``None``: the unit's own reason (a config
    file newer than the daemon, a unit that is not active), else an active daemon whose CRI plugin
    failed to load (its ``failed to load plugin`` line, or ``ctr``'s status), which leaves the kubelet
    without a CRI although the unit looks fine. A daemon whose CRI plugin is unknown (no journal
    line, no ``ctr``) is not restarted for it.
    """
    if not service or service["load_state"] != "loaded":
        return None
    if service["restart_reason"]:
        return service["restart_reason"]
    cri = node_fact(ContainerdCriLoaded, address=cri_address(dump))
    if cri["source"] and not cri["loaded"]:
        return f"its CRI plugin failed to load: {printable(cri['error'] or 'no reason given')[:300]}"
    return None


def backup_paths(main_path: str) -> list[str]:
    """What a backup holds: ``/etc/containerd``, and the main config where it lives outside it."""
    return [CONFIG_ROOT, *([main_path] if not main_path.startswith(f"{CONFIG_ROOT}/") else [])]


@operation(is_idempotent=False, idempotent_notice="Takes a new copy each time it runs.")
@locked_before_changes
def config_backed_up(path: str) -> Generator[Any, Any, None]:
    """
    Save containerd's config tree in a tar readable by root only, before it is changed.

    + path: the tar to write (absolute); its directory is created with mode 0700

    The tar holds ``/etc/containerd`` and, where the unit starts containerd with a main config
    outside it (``--config /etc/k8s/containerd.toml``), that file too: exactly what
    ``restarted_if_pending(backup=path)`` puts back. A path that does not exist is left out
    (a restore then removes it again). The files can carry registry credentials: the tar is
    mode 0600 in a 0700 directory.

    **Example:**

    .. code:: python

        containerd.config_backed_up(
            name="Back up containerd's config",
            path="/var/lib/pyinfra-gpunode/backup/containerd-20261201T000000Z.tar",
        )
    """
    _check_absolute("path", path)
    files = node_fact(ContainerdConfigFiles)
    facts_unchanged()  # the tar goes under /var/lib: what was read of the node stays current
    partial = f"{path}.partial"
    yield StringCommand(
        "umask",
        "077",
        "&&",
        "install",
        "-d",
        "-m",
        "0700",
        QuoteString(posixpath.dirname(path)),
        "&&",
        "tar",
        "-C",
        "/",
        "--ignore-failed-read",
        "-cf",
        QuoteString(partial),
        *(QuoteString(item.lstrip("/")) for item in backup_paths(files["main_path"])),
        "&&",
        "mv",
        "-f",
        QuoteString(partial),
        QuoteString(path),
    )


# Restart (after clearing a start-limit-hit state), then wait until the unit is active and the
# CRI plugin of this invocation reported, or the unit gave up (shell/containerd-restart.sh; exits 0:
# the facts read afterwards judge the result).
_RESTART_AND_WAIT = shell.script(Path(__file__).parent / "shell" / "containerd-restart.sh")


# Put a config tree back as a backup tar holds it, file by file, the failed files aside, and
# compare it with the backup (shell/containerd-restore.sh).
_RESTORE = shell.script(Path(__file__).parent / "shell" / "containerd-restore.sh")


def _restore(backup: str, roots: list[str], written: list[str], failure: str) -> StringCommand:
    """Put every entry under ``roots`` back as ``backup`` holds it, remove the ``written`` files it lacks
    (the failed files go aside), then fail naming every difference between the tree and the backup."""
    return StringCommand(
        shell.command(_RESTORE, "gpunode-restore", backup, FAILED_DIR, failure, *roots, "--", *written)
    )


@operation(
    is_idempotent=False,
    idempotent_notice="Restarts containerd only when its config is newer than the daemon or the unit is down.",
)
@locked_before_changes
def restarted_if_pending(
    timeout: int = RESTART_TIMEOUT,
    backup: str | None = None,
    dropped_runtimes: list[str] | None = None,
    backup_cri_problem: str | None = None,
    resumed: bool = False,
    mode: str = CONTAINERD_MODE,
) -> Generator[Any, Any, None]:
    """
    Restart containerd when a config file is newer than the running daemon or the unit is not
    active (failed, stopped), or a rollout turn cut off by an earlier run is ``resumed``, verify
    it, and put back what this run changed when the new config does not come up.

    + timeout: seconds to wait for the unit to be active and the CRI plugin to report
    + backup: the tar ``config_backed_up`` saved before this run wrote the config; ``None``
      when this run wrote nothing (then a failed restart restores nothing and says so)
    + dropped_runtimes: runtimes the previous daemon had that need not come back: their drop-in
      was removed and the write left them out (``Registration.dropped_runtimes``); without
      ``backup`` (the files changed before this run) every runtime no file defines any more
      is dropped, and the log names them
    + backup_cri_problem: why the config ``backup`` holds would not start the CRI plugin
      (``Registration.current_cri_problem`` read before the write); a failed restart then puts
      nothing back, since restoring it would take the CRI down as well
    + resumed: restart and verify even with nothing pending: the turn an earlier run began here
      (its mark on the node) may have ended anywhere, the restart's verification included
    + mode: ``runtime``: the new daemon must have loaded the nvidia runtime; ``nri`` (NRI mode, no
      runtime registered): only the runtimes of the merged config and of the previous daemon

    A config that would not start the CRI plugin by its own start rules (``mirrors`` with
    ``config_path``, a disabled CRI plugin, an undefined default runtime, an ``imports`` entry naming
    a missing file, ...) is never restarted into: the host fails naming the keys and files, and the
    running daemon keeps running.

    Verification: the unit is active and the CRI plugin of the new daemon loaded every runtime
    of the merged config (nvidia included) and every runtime the previous daemon had, with the
    dump's default runtime and registry ``config_path``, read from the plugin's start line in
    the journal; where containerd logs no such line (``[debug] level`` above info), from
    ``ctr plugins ls``: the CRI plugin's status ``ok`` on a daemon started after the config was
    written. The log says which way was used. On failure the paths in ``backup`` are restored
    file by file into the directories as they are (``/etc/containerd`` may be a mount point),
    with the backup's owner, group and mode; the config.toml or drop-in this run created is
    removed, other files are left alone (the failed files are kept under
    ``/var/lib/pyinfra-gpunode/failed/``, mode 0700); the tree is compared with the backup and
    any difference fails the host, naming it, before containerd is restarted. Then containerd is
    restarted again and checked against what the previous daemon loaded, and the host fails
    with both findings. ``systemctl reset-failed`` precedes each restart, so
    systemd's start rate limit (``start-limit-hit``) cannot keep the unit down.
    ``systemctl restart`` is used, never SIGHUP.

    **Example:**

    .. code:: python

        containerd.restarted_if_pending(name="Restart containerd where pending", timeout=60)
    """
    service = node_fact(ContainerdService)
    files = node_fact(ContainerdConfigFiles)
    dump = node_fact(ContainerdConfigDump, config_path=files["main_path"])
    reason = restart_reason(service, dump)
    if reason is None and resumed:
        reason = "a turn an earlier run began here is resumed"
    if not service or reason is None:
        host.noop("containerd runs its current config")
        return
    refused = cri_start_problem(dump, files["main_path"], files.get("texts") or {})
    if refused:
        yield fail(f"containerd not restarted: its config would not start the CRI plugin: {refused}")
        return
    address = cri_address(dump)
    previous = node_fact(ContainerdCriLoaded, address=address)
    summary = summarize(dump["dump"] if dump else {})
    dropped = set(dropped_runtimes or ())
    if backup is None:  # files changed before this run (or by a run without restart): the daemon loads what they say
        gone = sorted(set(previous["runtimes"]) - set(summary["runtimes"]) - dropped)
        dropped.update(gone)
        if gone and state.is_executing:
            logger.info("%sthe restart drops runtimes %s: no config file defines them any more",
                        host.print_prefix, ", ".join(gone))  # fmt: skip
    expected = expected_after_restart(summary, previous, dropped, runtime_expected=mode != "nri")
    restart = StringCommand(shell.command(_RESTART_AND_WAIT, "gpunode-restart", str(max(1, int(timeout)) * 5), address))
    if state.is_executing:
        logger.info("%srestarting containerd: %s", host.print_prefix, reason)
    yield restart
    problem, loaded = _problem(expected, address)
    if problem is None:
        logger.info("%scontainerd restarted and verified by %s", host.print_prefix, loaded["source"])
        return
    failed = f"containerd failed after the restart: {problem}"
    if backup is None:
        yield fail(
            f"{failed}; nothing was restored: this run wrote no containerd config on this node "
            f"(the restart was due because {reason})"
        )
        return
    if backup_cri_problem:
        yield fail(
            f"{failed}; nothing was restored: the config in the backup {backup} would not start the CRI "
            f"plugin either: {backup_cri_problem}"
        )
        return
    if not host.get_fact(File, path=backup):
        yield fail(f"{failed}; nothing was restored: the backup {backup} is missing")
        return
    yield _restore(
        backup,
        backup_paths(files["main_path"]),
        [files["main_path"], OUR_DROPIN],
        f"{failed}; restoring {backup} failed",
    )
    yield restart
    problem_after_rollback, _ = _problem(previous, address)
    if problem_after_rollback is None:
        yield fail(
            f"{failed}; the config this run wrote was replaced by the backup taken before it "
            "and containerd runs it again"
        )
    else:
        yield fail(f"{failed}; after restoring the backup taken before this run's write: {problem_after_rollback}")


def _problem(expected: CriLoaded, address: str) -> tuple[str | None, CriLoaded]:
    service = host.get_fact(ContainerdService)
    loaded = host.get_fact(ContainerdCriLoaded, address=address)
    if not service:
        return "systemd does not answer", loaded
    return restart_problem(service["active_state"], service["result"], loaded, expected), loaded
