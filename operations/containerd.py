"""Register the nvidia runtime with containerd's CRI plugin, safely on containerd 1.6, 1.7 and 2.x."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from pyinfra import host, state
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, Options, plan, staged_imports
from pyinfra_gpunode.containerd_dump import (
    CriLoaded,
    candidate_losses,
    expected_after_restart,
    restart_problem,
    runc_runtime,
    summarize,
)
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdNodeState,
    ContainerdService,
    ContainerdServiceInfo,
)
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._atomic import fail, write_file

BACKUP_DIR = "/var/lib/pyinfra-gpunode/backup"
BACKUP = f"{BACKUP_DIR}/containerd.tar"


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
    service: ContainerdServiceInfo | None = None

    @property
    def restart_pending(self) -> bool:
        return bool(self.service and self.service["restart_pending"])

    def diff(self) -> str:
        return "".join(
            "".join(difflib.unified_diff(
                self.current.get(path, "").splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=f"{path} (node)", tofile=f"{path} (planned)",
            ))
            for path, text in self.writes.items()
        )


def registration(
    binary: str = "/usr/bin/nvidia-container-runtime",
    systemd_cgroup: bool | None = None,
    default_runtime: bool = False,
    cdi_spec_dirs: list[str] | None = None,
    dropin_dir: str = "/etc/containerd/conf.d",
    binary_required: bool = False,
) -> Registration:
    """Read the node's containerd facts and judge the planned files (``nvidia_runtime``'s arguments)."""
    _check_absolute("binary", binary)
    _check_absolute("dropin_dir", dropin_dir)
    dirs = ["/etc/cdi", "/var/run/cdi"] if cdi_spec_dirs is None else cdi_spec_dirs
    for spec_dir in dirs:
        _check_absolute("cdi_spec_dirs entry", spec_dir)

    node = host.get_fact(ContainerdNodeState, binary=binary)
    version, files, before = node["version"], node["files"], node["dump"]
    if not version:
        return Registration("containerd is not installed: install it before registering the nvidia runtime",
                            installed=False)
    options = Options(
        binary=binary,
        systemd_cgroup=systemd_cgroup,
        default_runtime=default_runtime,
        cdi_spec_dirs=tuple(dirs),
        dropin_dir=dropin_dir.rstrip("/"),
    )
    before_dump = before["dump"] if before else {}
    result = plan(files["main_path"], files["texts"], version, options, runc_runtime(before_dump))
    if result.errors:
        return Registration("containerd config not changed: " + "; ".join(result.errors))
    for warning in result.warnings:
        logger.warning("%s%s", host.print_prefix, warning)

    if not node["binary_present"]:
        message = f"nvidia runtime binary {binary} is missing on the node"
        if binary_required:
            return Registration(f"containerd config not changed: {message} (gpunode_runtime_binary_required)")
        logger.warning("%s%s; containers using the nvidia runtime will fail until it is installed",
                       host.print_prefix, message)

    writes = {
        path: text
        for path, text in ((result.config_path, result.config_text), (OUR_DROPIN, result.dropin_text))
        if files["texts"].get(path) != text
    }
    current = {path: files["texts"][path] for path in writes if path in files["texts"]}
    if not writes:
        return Registration(service=node["service"])

    after = host.get_fact(
        ContainerdCandidateDump,
        config_path=result.config_path,
        config_text=staged_imports(result.config_text),
        dropin_path=OUR_DROPIN,
        dropin_text=result.dropin_text,
    )
    if after is None or after["error"]:
        return Registration("containerd config not changed: containerd rejects the candidate config: "
                            f"{after['error'] if after else 'no dump'}", writes=writes, current=current)
    losses = candidate_losses(
        before_dump, after["dump"], before["warnings"] if before else [], after["warnings"], result.intended, binary
    )
    if losses:
        return Registration("containerd config not changed: the candidate would lose: " + "; ".join(losses),
                            writes=writes, current=current)
    return Registration(writes=writes, current=current, service=node["service"])


@operation()
def nvidia_runtime(
    binary: str = "/usr/bin/nvidia-container-runtime",
    systemd_cgroup: bool | None = None,
    default_runtime: bool = False,
    cdi_spec_dirs: list[str] | None = None,
    dropin_dir: str = "/etc/containerd/conf.d",
    binary_required: bool = False,
):
    """
    Register the nvidia runtime with containerd's CRI plugin through a drop-in that survives
    other drop-ins.

    + binary: ``BinaryName`` of the nvidia runtime (absolute path)
    + systemd_cgroup: ``SystemdCgroup`` of the nvidia runtime; ``None`` follows runc
    + default_runtime: make nvidia the default runtime (otherwise the default is unchanged)
    + cdi_spec_dirs: CDI spec directories (containerd 1.7 and 2.x), default
      ``["/etc/cdi", "/var/run/cdi"]``
    + dropin_dir: the user's drop-in directory; config.toml's ``imports`` is made to cover
      ``<dropin_dir>/*.toml``
    + binary_required: fail (instead of warn) when ``binary`` is missing on the node

    config.toml is created if missing, and its ``imports`` is edited with comments kept so it
    covers the drop-in directory and ends with ``/etc/containerd/gpunode/nvidia-runtime.toml``,
    which therefore loads after every user drop-in. On containerd 1.6/1.7 that file carries
    the whole CRI section as the other files mean it; on 2.x only the keys it owns.

    Before anything is written the whole candidate tree is staged in a temporary directory on
    the node and judged by the node's own ``containerd config dump``: nvidia present, every
    runtime present before still present, the default runtime defined, every other CRI key
    unchanged and no new warning. Otherwise the host fails with what would have been lost and
    nothing changes. The previous ``/etc/containerd`` is kept in
    ``/var/lib/pyinfra-gpunode/backup/containerd.tar`` (``restarted_if_pending`` restores it
    when the restart fails). containerd is not restarted: a restart is pending until it is
    (see ``ContainerdService``).

    **Example:**

    .. code:: python

        containerd.nvidia_runtime(
            name="Register the nvidia runtime",
            binary="/usr/bin/nvidia-container-runtime",
        )
    """
    found = registration(binary, systemd_cgroup, default_runtime, cdi_spec_dirs, dropin_dir, binary_required)
    if not found.installed and not state.is_executing:
        host.noop("containerd is not installed yet; the runtime is registered once it is")
        return
    if found.problem:
        yield fail(found.problem)
        return
    if not found.writes:
        host.noop("containerd runtime nvidia is registered")
        return
    yield StringCommand(
        "mkdir", "-p", BACKUP_DIR, "&&",
        "if", "[", "-d", "/etc/containerd", "];", "then",
        "tar", "-C", "/", "-cf", f"{BACKUP}.new", "etc/containerd", ";",
        "else", "tar", "-cf", f"{BACKUP}.new", "-T", "/dev/null", ";", "fi", "&&",
        "mv", "-f", f"{BACKUP}.new", QuoteString(BACKUP),
    )
    for path, text in found.writes.items():
        yield from write_file(path, text)
    if state.is_executing:
        logger.info("%scontainerd restart pending: %s", host.print_prefix, ", ".join(found.writes))


FAILED_DIR = "/var/lib/pyinfra-gpunode/failed"

# Restart (after clearing a start-limit-hit state), then wait until the unit is active and the
# CRI plugin of this invocation logged its start or its failure, or the unit gave up. Exits 0:
# the facts read afterwards judge the result.
_RESTART_AND_WAIT = (
    "systemctl reset-failed containerd 2>/dev/null; "
    "if systemctl restart containerd; then "
    "for i in $(seq 1 {ticks}); do "
    "s=$(systemctl show -p ActiveState --value containerd); "
    'if [ "$s" = active ]; then '
    "id=$(systemctl show -p InvocationID --value containerd); "
    'journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" | '
    "grep -qE 'Start cri plugin with config|starting cri plugin|failed to load plugin io.containerd.(grpc.v1.cri|cri)' "
    '&& break; elif [ "$s" = failed ] || [ "$s" = inactive ]; then break; fi; sleep 0.2; done; fi; true'
)

# Put the backup taken before our last write back in place; the failed config is kept aside.
_RESTORE = (
    "t=$(mktemp -d /etc/.gpunode-restore.XXXXXX) && tar -C \"$t\" -xf {backup} && "
    "aside={failed}/containerd-$(date -u +%Y%m%dT%H%M%S.%NZ) && mkdir -p \"$aside\" && "
    "{{ if [ -d /etc/containerd ]; then mv /etc/containerd \"$aside\"/; fi; }} && "
    "{{ if [ -d \"$t/etc/containerd\" ]; then mv \"$t/etc/containerd\" /etc/containerd; fi; }}; "
    "rm -rf \"$t\"; true"
)


@operation(is_idempotent=False, idempotent_notice="Restarts containerd only when its config is newer than the daemon.")
def restarted_if_pending(timeout: int = 60):
    """
    Restart containerd when a config file is newer than the running daemon, verify it, and
    put the previous config back when the new one does not come up.

    + timeout: seconds to wait for the unit to be active and the CRI plugin to report

    Verification: the unit is active and the CRI plugin of the new daemon loaded every runtime
    of the merged config (nvidia included) and every runtime the previous daemon had, with the
    dump's default runtime and registry ``config_path``. On failure the ``/etc/containerd``
    saved by ``nvidia_runtime`` is restored (the failed files are kept under
    ``/var/lib/pyinfra-gpunode/failed/``), containerd is restarted again and checked against
    what the previous daemon loaded, and the host fails with both findings.
    ``systemctl reset-failed`` precedes each restart, so systemd's start rate limit
    (``start-limit-hit``) cannot keep the unit down. ``systemctl restart`` is used, never SIGHUP.

    **Example:**

    .. code:: python

        containerd.restarted_if_pending(name="Restart containerd where pending", timeout=60)
    """
    service = host.get_fact(ContainerdService)
    if not service or not service["restart_pending"]:
        host.noop("containerd runs its current config")
        return
    previous = host.get_fact(ContainerdCriLoaded)
    files = host.get_fact(ContainerdConfigFiles)
    dump = host.get_fact(ContainerdConfigDump, config_path=files["main_path"])
    expected = expected_after_restart(summarize(dump["dump"] if dump else {}), previous)
    restart = StringCommand(_RESTART_AND_WAIT.format(ticks=max(1, int(timeout)) * 5))
    yield restart
    problem = _problem(expected)
    if problem is None:
        return
    yield StringCommand(_RESTORE.format(backup=BACKUP, failed=FAILED_DIR))
    yield restart
    problem_after_rollback = _problem(previous)
    if problem_after_rollback is None:
        yield fail(f"containerd failed after the restart: {problem}; "
                   "the previous config was restored and containerd runs it again")
    else:
        yield fail(f"containerd failed after the restart: {problem}; "
                   f"after restoring the previous config: {problem_after_rollback}")


def _problem(expected: CriLoaded) -> str | None:
    service = host.get_fact(ContainerdService)
    if not service:
        return "systemd does not answer"
    return restart_problem(service["active_state"], service["result"], host.get_fact(ContainerdCriLoaded), expected)
