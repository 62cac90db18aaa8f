"""Register the nvidia runtime with containerd's CRI plugin, safely on containerd 1.6, 1.7 and 2.x."""

from __future__ import annotations

import functools
import inspect
import logging
import posixpath
from collections.abc import Generator, Mapping
from datetime import date
from pathlib import Path
from typing import Any, TypeVar, cast

from pyinfra import host, state
from pyinfra.api import FactBase, OperationValueError, QuoteString, StringCommand, operation
from pyinfra.facts.files import File

from pyinfra_gpunode import shell
from pyinfra_gpunode.containerd_dropin import MODES, OUR_DROPIN
from pyinfra_gpunode.containerd_dump import (
    CriLoaded,
    expected_after_restart,
    restart_problem,
    summarize,
)
from pyinfra_gpunode.containerd_files import (
    CONFIG_ROOT,
)
from pyinfra_gpunode.containerd_support import support_warning
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdNodeState,
    ContainerdService,
    ContainerdServiceInfo,
    DumpInfo,
    cri_address,
)
from pyinfra_gpunode.facts.k0s import K0sCandidateDump, K0sContainerd
from pyinfra_gpunode.facts.rancher import RancherCandidateDump, RancherContainerd, RancherContainerdInfo
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import _registration
from pyinfra_gpunode.operations._atomic import fail, write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._registration import (
    Read,
    Registration,
    RuntimeArguments,
    cri_start_problem,
    judgement,
    settled,
)
from pyinfra_gpunode.operations._shared import decided_once, facts_unchanged, node_fact
from pyinfra_gpunode.platform import (
    K0S_DROPINS,
    ContainerdPlatformInfo,
)
from pyinfra_gpunode.rollout import parse_turn_mark
from pyinfra_gpunode.settings import CONTAINERD_MODE, DROPIN_DIR, RESTART_TIMEOUT, RUNTIME_BINARY, RUNTIME_HANDLER

T = TypeVar("T")
BACKUP_DIR = "/var/lib/pyinfra-gpunode/backup"  # mode 0700: the files can carry registry credentials
FAILED_DIR = "/var/lib/pyinfra-gpunode/failed"  # mode 0700, like the backups


def _check_absolute(name: str, value: str) -> None:
    if not value.startswith("/"):
        raise OperationValueError(f"{name} must be an absolute path, got {value!r}")


def registration(**given: Any) -> Registration:
    """Read the node's containerd facts and judge the planned files (``nvidia_runtime``'s arguments), with
    the mark of a rollout turn an earlier run left unfinished on the node: once per node read (the candidate
    config is staged and judged once), whether the plan, the rollout or the step asks. The judgement is
    ``_registration.judgement``'s; this makes the reads it asks for and says what it says."""
    arguments = bound_arguments(**given)
    _check_arguments(**arguments)
    node = node_fact(ContainerdNodeState, binary=arguments["binary"])

    def judged() -> Registration:
        found = settled(judgement(arguments), _read)
        support = support_warning(node.get("version"), date.today())
        for level, message in [*found.said, *([(logging.WARNING, support)] if support else [])]:
            logger.log(level, "%s%s", host.print_prefix, message)
        found.turn_mark, found.turn_mark_problem = parse_turn_mark(node.get("turn", []))
        return found

    return decided_once("registration", node, repr(sorted(arguments.items())), judged)


def bound_arguments(**given: Any) -> RuntimeArguments:
    """``nvidia_runtime``'s arguments ``given``, with the defaults of those not given (a wrong name raises)."""
    bound = _runtime_signature().bind(**given)
    bound.apply_defaults()
    return cast(RuntimeArguments, dict(bound.arguments))


@functools.cache
def _runtime_signature() -> inspect.Signature:
    """``nvidia_runtime``'s signature, read once."""
    return inspect.signature(nvidia_runtime)


def _check_arguments(mode: str, binary: str, dropin_dir: str, cdi_spec_dirs: list[str] | None, **_: Any) -> None:
    """Refuse arguments no node could take, naming the argument, before anything is read."""
    if mode not in MODES:
        raise OperationValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    _check_absolute("binary", binary)
    _check_absolute("dropin_dir", dropin_dir)
    for spec_dir in cdi_spec_dirs or []:
        _check_absolute("cdi_spec_dirs entry", spec_dir)


# The facts behind the reads a judgement asks for (``_registration.Read``); the node's own and its CRI
# plugin's state come from a current shared read where one holds them (``node_fact``).
_FACTS: dict[str, type[FactBase[Any]]] = {
    "node": ContainerdNodeState,
    "cri": ContainerdCriLoaded,
    "k0s": K0sContainerd,
    "rancher": RancherContainerd,
    "candidate": ContainerdCandidateDump,
    "k0s candidate": K0sCandidateDump,
    "rancher candidate": RancherCandidateDump,
}
_SHARED = ("node", "cri")


def _read(asked: Read) -> Any:
    """Make a read a judgement asks for on this node."""
    arguments: dict[str, Any] = dict(asked.arguments)
    if "stdin" in arguments:
        arguments["_stdin"] = arguments.pop("stdin")
    fact = _FACTS[asked.fact]
    return node_fact(fact, **arguments) if asked.fact in _SHARED else host.get_fact(fact, **arguments)


def rancher_refusal(
    info: ContainerdPlatformInfo | None, requests: Mapping[str, object], tree: RancherContainerdInfo | None = None
) -> str | None:
    """``_registration``'s ``rancher_refusal``, with the agent's tree read where it needs it."""
    return settled(_registration.rancher_refusal(info, requests, tree), _read)


def restart_reason(service: ContainerdServiceInfo | None, dump: DumpInfo | None) -> str | None:
    """``_registration``'s ``restart_reason``, with the CRI plugin's state read where it needs it."""
    return settled(_registration.restart_reason(service, dump), _read)


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
