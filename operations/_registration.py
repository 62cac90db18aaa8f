"""The nvidia runtime registration judged from what was read of one node, without I/O.

``judgement(arguments)`` yields each ``Read`` it needs (the node's containerd files, service and dump; k0s'
or the k3s/RKE2 agent's tree; the CRI plugin's state; the node's own containerd merging a staged
candidate), takes its value, and returns the ``Registration`` (what the step writes, or why it may not,
and what it says on the way). ``settled`` runs a judgement with a function that makes the reads:
``containerd.registration`` passes one that reads the node, the tests one that serves recorded values.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from pyinfra_gpunode import k0s, rancher
from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, Options, Plan, plan, same_meaning, staged_imports
from pyinfra_gpunode.containerd_dump import CriLoaded, candidate_losses, nri_losses, runc_runtime, summarize
from pyinfra_gpunode.containerd_files import (
    CONFIG_ROOT,
    ConfigTree,
    links_in_the_way,
    load_order,
    missing_imports,
    not_regular_files,
    resolve_tree,
    strictest_mode,
    version_skew_files,
)
from pyinfra_gpunode.cri_rules import cri_start_findings, import_findings, stopping
from pyinfra_gpunode.facts.containerd import (
    ContainerdNodeStateInfo,
    ContainerdServiceInfo,
    DumpInfo,
    candidate_input,
    cri_address,
)
from pyinfra_gpunode.facts.k0s import K0sContainerdInfo
from pyinfra_gpunode.facts.k0s import candidate_input as k0s_candidate_input
from pyinfra_gpunode.facts.rancher import RancherContainerdInfo
from pyinfra_gpunode.log import printable
from pyinfra_gpunode.operator import handler_problem
from pyinfra_gpunode.platform import (
    K0S_CONFIG,
    ContainerdPlatformInfo,
    rancher_config,
    rancher_note,
    rancher_nvidia,
    rancher_restart_reason,
    rancher_unapplied,
    requests_of,
)
from pyinfra_gpunode.platform import refusal as platform_refusal
from pyinfra_gpunode.read_limits import unanswered
from pyinfra_gpunode.redaction import redacted
from pyinfra_gpunode.rollout import TurnMark
from pyinfra_gpunode.versions import ContainerdVersionInfo

T = TypeVar("T")
Judgement = Generator["Read", Any, T]  # yields the reads it needs, is sent their values, returns T
MISSING_BINARY = "containers using the nvidia runtime will fail until it is installed"


@dataclass(frozen=True)
class Read:
    """A read of the node the judgement needs: which (``node``, ``cri``, ``k0s``, ``rancher``, ``candidate``,
    ``k0s candidate``, ``rancher candidate``) and its arguments (a candidate's staged files as ``stdin``)."""

    fact: str
    arguments: tuple[tuple[str, str], ...] = ()


def read(fact: str, **arguments: str) -> Read:
    return Read(fact, tuple(sorted(arguments.items())))


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
    # What the step says of the node on the way (level, message): the plan's warnings and dropped keys.
    said: list[tuple[int, str]] = field(default_factory=list)

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


class RuntimeArguments(TypedDict):
    """``containerd.nvidia_runtime``'s arguments, every one given (its signature holds their defaults and its
    docstring their meaning)."""

    binary: str
    systemd_cgroup: bool | None
    default_runtime: bool
    cdi_spec_dirs: list[str] | None
    dropin_dir: str
    binary_required: bool
    enable_cdi: bool | None
    handler: str
    mode: str
    enable_nri: bool | None


def runtime_options(arguments: RuntimeArguments) -> Options:
    """What the drop-in's plan takes of ``arguments``."""
    cdi_spec_dirs = arguments["cdi_spec_dirs"]
    return Options(
        binary=arguments["binary"],
        systemd_cgroup=arguments["systemd_cgroup"],
        default_runtime=arguments["default_runtime"],
        cdi_spec_dirs=None if cdi_spec_dirs is None else tuple(cdi_spec_dirs),
        dropin_dir=arguments["dropin_dir"].rstrip("/"),
        enable_cdi=arguments["enable_cdi"],
        mode=arguments["mode"],
        enable_nri=arguments["enable_nri"],
    )


def judgement(arguments: RuntimeArguments) -> Judgement[Registration]:
    """The registration ``containerd.nvidia_runtime``'s ``arguments`` (all of them, checked) come to on one
    node, from the reads it yields."""
    judging = _Judge()
    found = yield from judging.containerd(arguments)
    found.said = judging.said
    return found


def settled(judging: Judgement[T], make: Callable[[Read], Any]) -> T:
    """What ``judging`` comes to, each read it yields made once by ``make``, in the order it asks."""
    try:
        asked = next(judging)
        while True:
            asked = judging.send(make(asked))
    except StopIteration as done:
        return done.value


def restart_reason(service: ContainerdServiceInfo | None, dump: DumpInfo | None) -> Judgement[str | None]:
    """``_Judge.restart_reason`` on its own."""
    return _Judge().restart_reason(service, dump)


def rancher_refusal(
    info: ContainerdPlatformInfo | None, requests: Mapping[str, object], tree: RancherContainerdInfo | None = None
) -> Judgement[str | None]:
    """``_Judge.rancher_refusal`` on its own."""
    return _Judge().rancher_refusal(info, requests, tree)


class _Judge:
    """One judgement of one node, and what it says on the way."""

    def __init__(self) -> None:
        self.said: list[tuple[int, str]] = []

    def containerd(self, arguments: RuntimeArguments) -> Judgement[Registration]:
        options, handler = runtime_options(arguments), arguments["handler"]
        binary, nri = options.binary, options.mode == "nri"
        node: ContainerdNodeStateInfo = yield read("node", binary=binary)
        owned = platform_refusal(node.get("platform"))  # k3s, RKE2, k0s, EKS nodeadm: their config, not ours
        if owned:
            return Registration(owned)
        if rancher_nvidia(node.get("platform")):
            requests = requests_of(arguments)
            tree = yield from self.rancher_tree(
                node["platform"]
            )  # read once: refusal, our drop-in, the plan all use it
            refused = yield from self.rancher_refusal(node["platform"], requests, tree)
            if refused:
                return Registration(refused)
            written = tree is not None and rancher.dropin_path(node["platform"]["name"] or "") in tree["texts"]
            if tree is not None and (rancher_unapplied(node["platform"], requests) or written):
                return (yield from self.rancher_dropin(node["platform"], requests, handler, tree))
            return rancher_registration(node["platform"])
        if (node.get("platform") or {}).get("name") == "k0s":
            binary_required, present = arguments["binary_required"], node["binary_present"]
            return (yield from self.k0s(node["platform"], options, handler, binary_required, present))
        version, files, before = node["version"], node["files"], node["dump"]
        if not version:
            return Registration(
                "containerd is not installed: install it before registering the nvidia runtime", installed=False
            )
        if before and unanswered(before["error"]):
            return Registration(f"containerd config not changed: {before['error']}")
        not_files = not_regular_files([files["main_path"], OUR_DROPIN], files["kinds"])
        if not_files:
            return Registration(
                "containerd config not changed: "
                + "; ".join(not_files)
                + ": gpunode writes regular files only; move it away or replace it with a file"
            )
        before_dump = before["dump"] if before else {}
        current_cri_problem = cri_start_problem(before, files["main_path"], files["texts"], version=version)
        result = plan(files["main_path"], files["texts"], version, options, runc_runtime(before_dump))
        if result.errors:
            return Registration("containerd config not changed: " + "; ".join(result.errors))
        self.said += [(logging.WARNING, warning) for warning in result.warnings]
        self.said += [(logging.INFO, line) for line in result.dropped_lines]
        mode_line = result.mode_line or None

        if not node["binary_present"] and not nri:  # NRI mode runs no nvidia runtime binary
            message = f"nvidia runtime binary {binary} is missing on the node"
            if arguments["binary_required"]:
                return Registration(f"containerd config not changed: {message} (gpunode_runtime_binary_required)")
            if options.default_runtime:
                return Registration(
                    f"containerd config not changed: {message}, and making nvidia the default "
                    "runtime (gpunode_nvidia_default_runtime) would fail every pod without a "
                    "RuntimeClass: install the runtime first"
                )
            self.said.append((logging.WARNING, f"{message}; {MISSING_BINARY}"))

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
                restart_reason=(yield from self.restart_reason(node["service"], node["dump"])),
                current_cri_problem=current_cri_problem,
                mode_line=mode_line,
            )
        linked = _through_links(list(writes), files["links"])
        if linked:
            return linked

        after: DumpInfo | None = yield read(
            "candidate",
            config_path=result.config_path,
            dropin_path=OUR_DROPIN,
            stdin=candidate_input(staged_imports(result.config_text), result.dropin_text),
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
            result.config_path,
            {**files["texts"], result.config_path: result.config_text, OUR_DROPIN: result.dropin_text},
        )
        found.problem = candidate_problem(before, after, candidate_tree, result, binary, handler, nri, version)
        if found.problem:
            return found
        assert after is not None and after["summary"] is not None  # a dump without an error has its summary
        found.service = node["service"]
        found.restart_reason = yield from self.restart_reason(node["service"], node["dump"])
        found.dropped_runtimes = sorted(set(summarize(before_dump)["runtimes"]) - set(after["summary"]["runtimes"]))
        return found

    def k0s(
        self, info: ContainerdPlatformInfo, options: Options, handler: str, binary_required: bool, binary_present: bool
    ) -> Judgement[Registration]:
        """A k0s node whose ``/etc/k0s/containerd.toml`` k0s manages: our drop-in in ``/etc/k0s/containerd.d``,
        planned as on containerd 2.x (version 3, plugin ``io.containerd.cri.v1.runtime``) and judged by k0s'
        own containerd on a staged copy of its tree, never written here (the write restarts k0s' containerd:
        ``platform.runtime_dropin_applied`` writes it in the node's turn)."""
        node: K0sContainerdInfo = yield read("k0s")
        layout = k0s.layout_problem(node["version"], node["texts"])
        if layout:
            return Registration(k0s.refusal(info["evidence"], layout), platform=info)
        version, texts, before = node["version"], node["texts"], node["dump"]
        assert version is not None  # layout_problem refuses a node without k0s' containerd
        linked = _through_links([k0s.DROPIN], node["links"], info)
        if linked:
            return linked
        if before is None or before["error"]:
            error = before["error"] if before else "no dump"
            return Registration(f"containerd config not changed: k0s' containerd does not load {K0S_CONFIG}: {error}")
        mine = k0s.options(options)
        result = plan(K0S_CONFIG, texts, version, mine, runc_runtime(before["dump"]))
        errors = result.errors or k0s.dropin_problems(result.dropin_text)
        if errors:
            return Registration("containerd config not changed: " + "; ".join(errors), platform=info)
        self.said += [(logging.WARNING, warning) for warning in result.warnings]
        nri = options.mode == "nri"
        if not binary_present and not nri:
            message = f"nvidia runtime binary {options.binary} is missing on the node"
            if binary_required or options.default_runtime:
                return Registration(f"containerd config not changed: {message}", platform=info)
            self.said.append((logging.WARNING, f"{message}; {MISSING_BINARY}"))
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
        after: DumpInfo | None = yield read(
            "k0s candidate", dropin_path=k0s.DROPIN, stdin=k0s_candidate_input(main, result.dropin_text)
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
        found.problem = candidate_problem(before, after, candidate_tree, result, options.binary, handler, nri)
        return found

    def rancher_refusal(
        self,
        info: ContainerdPlatformInfo | None,
        requests: Mapping[str, object],
        tree: RancherContainerdInfo | None = None,
    ) -> Judgement[str | None]:
        """Why a k3s or RKE2 node whose agent adds the nvidia runtime itself is refused for host data it asks
        beyond that (``platform.rancher_unapplied``), or ``None``: also where a drop-in in the agent's
        ``config-v3.toml.d`` applies it all (the agent's containerd 2.x, its generated config version 3
        importing that directory, nvidia already in it, no binary other than the one the agent finds).
        ``tree``: the ``RancherContainerd`` read the caller has (asked for here where it has none)."""
        unapplied = rancher_unapplied(info, requests)
        if not unapplied or not info or rancher_nvidia(info) != "present" or not rancher.appliable(requests, info):
            return unapplied
        program = info["name"] or ""
        node: RancherContainerdInfo = tree or (yield read("rancher", program=program))
        layout = rancher.layout_problem(node["version"], node["texts"].get(rancher_config(program)), program)
        return unapplied if layout else None

    def rancher_tree(self, info: ContainerdPlatformInfo | None) -> Judgement[RancherContainerdInfo | None]:
        """The agent's containerd files, dump and processes, where it adds the nvidia runtime itself (only then
        can a drop-in of ours apply, or one an earlier run left be planned again); else ``None``."""
        if not info or rancher_nvidia(info) != "present":
            return None
        return (yield read("rancher", program=info["name"] or ""))

    def rancher_dropin(
        self, info: ContainerdPlatformInfo, requests: dict[str, object], handler: str, node: RancherContainerdInfo
    ) -> Judgement[Registration]:
        """A k3s or RKE2 node whose agent adds the nvidia runtime itself and host data asks for more
        (``requests``), where a drop-in applies it (``rancher_refusal``): our drop-in in the agent's
        ``config-v3.toml.d`` with only the keys asked, judged by the agent's own containerd on a staged copy of
        the generated config and the directory, never written here (it takes a restart of the agent's unit:
        ``platform.runtime_dropin_applied`` writes it in the node's turn)."""
        program = info["name"] or ""
        config, path = rancher_config(program), rancher.dropin_path(program)
        texts, before = node["texts"], node["dump"]
        linked = _through_links([path], node["links"], info)
        if linked:
            return linked
        if before is None or before["error"]:
            error = before["error"] if before else "no dump"
            return Registration(
                f"containerd config not changed: {program}'s containerd does not load {config}: {error}"
            )
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
        after: DumpInfo | None = yield read("rancher candidate", program=program, stdin=k0s_candidate_input(main, text))
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
        found.problem = candidate_problem(before, after, candidate_tree, judged, info["toolkit"], handler, False)
        unshown = rancher.unshown(after["dump"], table, path) if after and not found.problem else []
        if unshown:
            found.problem = "containerd config not changed: the candidate config does not show " + "; ".join(unshown)
        return found

    def restart_reason(self, service: ContainerdServiceInfo | None, dump: DumpInfo | None) -> Judgement[str | None]:
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
        cri: CriLoaded = yield read("cri", address=cri_address(dump))
        if cri["source"] and not cri["loaded"]:
            return f"its CRI plugin failed to load: {printable(cri['error'] or 'no reason given')[:300]}"
        return None


def candidate_problem(
    before: DumpInfo | None,
    after: DumpInfo | None,
    candidate_tree: ConfigTree,
    result: Plan,
    binary: str,
    handler: str,
    nri: bool,
    version: ContainerdVersionInfo | None = None,
) -> str | None:
    """Why the candidate tree (merged by the node's own containerd as ``after``) may not be written: it does
    not load, the CRI plugin's start rules refuse it, it loses what the node has now (``before``), or the
    handler's runtime is not ``binary``; ``None`` when it may."""
    if after is None or after["error"]:
        error = after["error"] if after and after["error"] else "no dump"
        skew = version_skew_files(error, load_order(candidate_tree))
        return f"containerd config not changed: containerd rejects the candidate config: {error}" + (
            f" ({skew})" if skew else ""
        )
    refused = cri_start_findings(after["dump"], load_order(candidate_tree), version=version)
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


def rancher_registration(info: ContainerdPlatformInfo) -> Registration:
    """k3s or RKE2 add the nvidia runtime themselves: nothing to write; their unit restarted where
    their generated config lacks it yet."""
    if rancher_nvidia(info) == "present":
        return Registration(platform=info, note=rancher_note(info))
    return Registration(platform=info, restart_reason=rancher_restart_reason(info))


def cri_start_problem(
    dump: DumpInfo | None,
    main_path: str,
    texts: dict[str, str],
    root: str = CONFIG_ROOT,
    version: ContainerdVersionInfo | None = None,
) -> str | None:
    """Why the config tree ``texts`` (merged as ``dump``) would keep the CRI plugin from starting, by the
    plugin's own start rules (those of containerd ``version``; every rule where it is not known), or ``None``
    (also where containerd is missing, or the files do not load for another reason than an ``imports`` entry
    naming a missing file: containerd 1.x's dump fails on that)."""
    if not dump:
        return None
    missing = missing_imports(main_path, texts, root)
    if dump["error"]:
        return stopping(import_findings(missing))
    tree = load_order(resolve_tree(main_path, texts, root))
    return stopping(cri_start_findings(dump["dump"], tree, missing, version=version))


def _through_links(
    paths: list[str], links: dict[str, str], info: ContainerdPlatformInfo | None = None
) -> Registration | None:
    """A refusal where a file we would write, or a directory above it, is a symbolic link (``links``: path ->
    target): a write would land elsewhere, and a backup of the directory would hold only the link."""
    found = links_in_the_way(paths, links)
    if not found:
        return None
    return Registration(
        "containerd config not changed: "
        + "; ".join(found)
        + ": gpunode writes real files only, never through a link; "
        "replace the link with the file or directory it points to",
        platform=info,
    )
