"""Register the nvidia runtime with containerd's CRI plugin, safely on containerd 1.6, 1.7 and 2.x."""

from __future__ import annotations

import logging
import weakref

from pyinfra import host, state
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation
from pyinfra.facts.files import File

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, RUNTIME, Options, plan, staged_imports
from pyinfra_gpunode.containerd_dump import candidate_losses, runc_runtime
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdCriLoaded,
    ContainerdService,
    ContainerdVersion,
)
from pyinfra_gpunode.operations._atomic import fail, write_file

logger = logging.getLogger(__name__)

BACKUP_DIR = "/var/lib/pyinfra-gpunode/backup"
BACKUP = f"{BACKUP_DIR}/containerd.tar"


def _check_absolute(name: str, value: str) -> None:
    if not value.startswith("/"):
        raise OperationValueError(f"{name} must be an absolute path, got {value!r}")


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
    ``/var/lib/pyinfra-gpunode/backup/containerd.tar``. containerd is not restarted: a restart
    is pending until it is (see ``ContainerdService``).

    **Example:**

    .. code:: python

        containerd.nvidia_runtime(
            name="Register the nvidia runtime",
            binary="/usr/bin/nvidia-container-runtime",
        )
    """
    _check_absolute("binary", binary)
    _check_absolute("dropin_dir", dropin_dir)
    dirs = ["/etc/cdi", "/var/run/cdi"] if cdi_spec_dirs is None else cdi_spec_dirs
    for spec_dir in dirs:
        _check_absolute("cdi_spec_dirs entry", spec_dir)

    version = host.get_fact(ContainerdVersion)
    if not version:
        if state.is_executing:
            yield fail("containerd is not installed: install it before registering the nvidia runtime")
        else:
            host.noop("containerd is not installed yet; the runtime is registered once it is")
        return

    files = host.get_fact(ContainerdConfigFiles)
    options = Options(
        binary=binary,
        systemd_cgroup=systemd_cgroup,
        default_runtime=default_runtime,
        cdi_spec_dirs=tuple(dirs),
        dropin_dir=dropin_dir.rstrip("/"),
    )
    before = host.get_fact(ContainerdConfigDump, config_path=files["main_path"])
    before_dump = before["dump"] if before else {}
    result = plan(files["main_path"], files["texts"], version, options, runc_runtime(before_dump))
    if result.errors:
        yield fail("containerd config not changed: " + "; ".join(result.errors))
        return
    for warning in result.warnings:
        logger.warning("%s%s", host.print_prefix, warning)

    if not host.get_fact(File, path=binary):
        message = f"nvidia runtime binary {binary} is missing on the node"
        if binary_required:
            yield fail(f"containerd config not changed: {message} (gpunode_runtime_binary_required)")
            return
        logger.warning("%s%s; containers using the nvidia runtime will fail until it is installed",
                       host.print_prefix, message)

    writes = {
        path: text
        for path, text in ((result.config_path, result.config_text), (OUR_DROPIN, result.dropin_text))
        if files["texts"].get(path) != text
    }
    if not writes:
        host.noop("containerd runtime nvidia is registered")
        return

    after = host.get_fact(
        ContainerdCandidateDump,
        config_path=result.config_path,
        config_text=staged_imports(result.config_text),
        dropin_path=OUR_DROPIN,
        dropin_text=result.dropin_text,
    )
    if after is None or after["error"]:
        yield fail(f"containerd config not changed: containerd rejects the candidate config: "
                   f"{after['error'] if after else 'no dump'}")
        return
    losses = candidate_losses(
        before_dump, after["dump"], before["warnings"] if before else [], after["warnings"], result.intended, binary
    )
    if losses:
        yield fail("containerd config not changed: the candidate would lose: " + "; ".join(losses))
        return

    yield StringCommand(
        "mkdir", "-p", BACKUP_DIR, "&&",
        "if", "[", "-d", "/etc/containerd", "];", "then",
        "tar", "-C", "/", "-cf", f"{BACKUP}.new", "etc/containerd", "&&",
        "mv", "-f", f"{BACKUP}.new", QuoteString(BACKUP), ";", "fi",
    )
    for path, text in writes.items():
        yield from write_file(path, text)
    if state.is_executing:
        logger.info("%scontainerd restart pending: %s", host.print_prefix, ", ".join(writes))


# Runs per State: the first host whose restart failed halts the rollout for every later host.
_HALTED: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()

_WAIT_FOR_CRI = (
    "for i in $(seq 1 {timeout}); do "
    "if systemctl is-active -q containerd; then "
    "id=$(systemctl show -p InvocationID --value containerd); "
    'journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" | '
    "grep -qE 'Start cri plugin with config|starting cri plugin|failed to load plugin io.containerd.(grpc.v1.cri|cri)' "
    "&& exit 0; fi; sleep 1; done; "
    "echo 'containerd did not report its CRI plugin within {timeout}s' >&2; exit 1"
)


@operation(is_idempotent=False, idempotent_notice="Restarts containerd only when its config is newer than the daemon.")
def restarted_if_pending(timeout: int = 60):
    """
    Restart containerd when a config file is newer than the running daemon, then verify it.

    + timeout: seconds to wait for the unit to be active and the CRI plugin to report

    Verification: the unit is active and the CRI plugin of the new daemon loaded the nvidia
    runtime and every runtime the previous daemon had. Run it with ``_serial=True``: the
    first host that fails halts the restarts on every host after it in the same run.
    ``systemctl restart`` is used, never SIGHUP.

    **Example:**

    .. code:: python

        containerd.restarted_if_pending(name="Restart containerd where pending", _serial=True)
    """
    run = state._get_module()  # type: ignore[attr-defined]  # the State behind the context proxy
    if run in _HALTED:
        host.noop(f"containerd restart halted after the failure on {_HALTED[run]}")
        return
    service = host.get_fact(ContainerdService)
    if not service or not service["restart_pending"]:
        host.noop("containerd runs its current config")
        return
    loaded_before = host.get_fact(ContainerdCriLoaded)
    done = False
    try:
        yield StringCommand("systemctl", "restart", "containerd")
        yield StringCommand(_WAIT_FOR_CRI.format(timeout=int(timeout)))
        loaded = host.get_fact(ContainerdCriLoaded)
        missing = sorted({RUNTIME, *loaded_before["runtimes"]} - set(loaded["runtimes"]))
        if not loaded["loaded"] or missing:
            yield fail(
                f"containerd restarted but its CRI plugin is not ready: "
                f"{loaded['error'] or 'missing runtimes ' + ', '.join(missing)}"
            )
        done = True
    finally:
        if not done and state.is_executing:
            _HALTED[run] = host.name
