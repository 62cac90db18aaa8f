"""Nodes whose containerd a platform (k3s, RKE2, k0s, EKS nodeadm) owns: refused before anything changes on
them, except k3s and RKE2 where they add the nvidia runtime themselves (their unit restarted when due)."""

from __future__ import annotations

import posixpath
from collections.abc import Generator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_gpunode import k0s, shell
from pyinfra_gpunode.containerd_dump import CriLoaded, expected_after_restart, restart_problem, summarize
from pyinfra_gpunode.facts.k0s import K0sContainerd, K0sCriLoaded
from pyinfra_gpunode.facts.platform import ContainerdPlatform
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import containerd
from pyinfra_gpunode.operations._atomic import fail, write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.platform import (
    K0S_DROPINS,
    K0S_SOCKET,
    K3S_SOCKET,
    rancher_config,
    rancher_nvidia,
    rancher_restart_reason,
    rancher_unapplied,
    refusal,
)
from pyinfra_gpunode.settings import RESTART_TIMEOUT

_RESTART_AND_VERIFY = shell.script(Path(__file__).parent / "shell" / "platform-restart.sh")
# Wait for k0s to restart its containerd after a change in its drop-in directory (shell/k0s-wait.sh).
_K0S_WAIT = shell.script(Path(__file__).parent / "shell" / "k0s-wait.sh")


@operation()
def supported(requests: dict[str, object] | None = None) -> Generator[Any, Any, None]:
    """
    Fail this node when a platform owns its containerd: k3s or RKE2 (containerd inside their
    agent's unit, its config generated at every start) where they do not add the nvidia runtime
    themselves (no ``nvidia-container-runtime`` in ``/usr/local/nvidia/toolkit`` or ``/usr/bin``),
    k0s where gpunode writes no drop-in (``/etc/k0s/containerd.toml`` not k0s-managed, or k0s 1.35 and
    earlier, whose containerd 1.7 reads drop-ins only through the CRI config k0s merges at its restart)
    or EKS nodeadm (``/etc/containerd/config.toml`` rewritten from its NodeConfig at every boot).

    An edit of such a node's containerd config is lost or never read, and ``containerd.service``
    is not where its containerd runs. The failure names the platform, what was found of it, and
    where the nvidia runtime goes instead (for EKS nodeadm: the NodeConfig's
    ``spec.containerd.config``). Put it first: on a refused node nothing else should run. A dry
    run prints the refusal as the node's plan.

    + requests: the containerd step's host-data keys that ask for more than their defaults
      (``platform.runtime_requests``): a k3s or RKE2 node whose agent adds the nvidia runtime itself
      is refused where any of them would go unapplied, each named with the agent's own way to get it

    **Example:**

    .. code:: python

        platform.supported(
            name="containerd: not owned by a platform",
            requests={"gpunode_nvidia_default_runtime": True},
        )
    """
    problem = platform_problem(requests)
    if problem:
        yield fail(problem)
        return
    host.noop("no platform owns containerd")


def platform_problem(requests: Mapping[str, object] | None = None) -> str | None:
    """Why ``supported`` fails this node (``platform.refusal``; on a k3s or RKE2 node, host data ``requests``
    left unapplied, ``platform.rancher_unapplied``; on a k0s node whose config k0s manages,
    ``k0s.layout_problem`` from k0s' own containerd and files), or ``None``. Reads only."""
    found = node_fact(ContainerdPlatform)
    problem = refusal(found) or rancher_unapplied(found, requests or {})
    if problem or found["name"] != "k0s":
        return problem
    node = host.get_fact(K0sContainerd)
    why = k0s.layout_problem(node["version"], node["texts"])
    return k0s.refusal(found["evidence"], why) if why else None


@operation(is_idempotent=False, idempotent_notice="Restarts only while the generated config lacks nvidia.")
def unit_restarted(timeout: int = RESTART_TIMEOUT) -> Generator[Any, Any, None]:
    """
    Restart the k3s or RKE2 unit (``k3s``, ``k3s-agent``, ``rke2-server``, ``rke2-agent``) whose
    generated containerd config has no nvidia runtime yet although the agent finds the toolkit's
    ``nvidia-container-runtime``: at its start the agent adds the nvidia runtimes itself. The
    kubelet restarts with the unit.

    + timeout: seconds the unit may take to regenerate its config with the nvidia runtime and
      bring its CRI plugin up on ``/run/k3s/containerd/containerd.sock``

    Verified by the regenerated config (written after the restart, defining ``nvidia``) and by
    ``ctr --address /run/k3s/containerd/containerd.sock plugins ls`` listing the CRI plugin as
    ``ok``; otherwise the host fails with what was missing. Nothing was written, so nothing is
    rolled back. Elsewhere it does nothing.

    **Example:**

    .. code:: python

        platform.unit_restarted(name="k3s: restarted with the nvidia runtime", timeout=120)
    """
    found = node_fact(ContainerdPlatform)
    if rancher_nvidia(found) != "restart" or not found["name"] or not found["unit"]:
        host.noop("no platform unit needs a restart for the nvidia runtime")
        return
    if state.is_executing:
        logger.info("%srestarting %s", host.print_prefix, rancher_restart_reason(found))
    ticks = str(max(1, int(timeout)) * 5)
    config = rancher_config(found["name"])
    yield StringCommand(
        shell.command(
            _RESTART_AND_VERIFY, "gpunode-platform-restart", found["unit"], config, K3S_SOCKET, ticks, found["name"]
        )
    )


@operation(
    is_idempotent=False, idempotent_notice="Writes, and so restarts k0s' containerd, only while the drop-in differs."
)
@locked_before_changes
def k0s_runtime_applied(
    timeout: int = RESTART_TIMEOUT, runtime: dict[str, Any] | None = None
) -> Generator[Any, Any, None]:
    """
    Register the nvidia runtime on a k0s node with a drop-in in ``/etc/k0s/containerd.d/``
    (``nvidia-gpunode.toml``), which k0s answers by restarting its containerd: the write is the
    restart, so call it only in the node's turn (the rollout does, after the before-hook). The
    kubelet keeps running: k0s restarts only containerd.

    + timeout: seconds k0s' containerd may take, once k0s restarted it (about 3 s after the write),
      to bring its CRI plugin up on ``/run/k0s/containerd.sock``
    + runtime: ``containerd.nvidia_runtime``'s arguments (the drop-in is planned and judged as there,
      by k0s' own containerd on a staged copy of its tree)

    First ``/etc/k0s/containerd.d`` is saved in a tar readable by root only (under
    ``/var/lib/pyinfra-gpunode/backup``), then the drop-in is written and the new containerd
    process under the k0s unit (another PID than before) is verified as ``containerd.restarted_if_pending``
    verifies containerd.service: its CRI plugin loaded every runtime of the merged config, nvidia
    included, and every runtime the previous process had (from its start line in the journal, else
    ``ctr plugins ls`` on the k0s socket). On failure the directory is put back as the tar holds it
    (our file removed, or restored), which makes k0s restart containerd again, that restart is
    verified against the previous process, and the host fails with both findings. Where the
    drop-in already says what is planned it does nothing, and a refused node fails naming why.

    **Example:**

    .. code:: python

        platform.k0s_runtime_applied(name="k0s: nvidia runtime drop-in written and verified", timeout=60)
    """
    found = containerd.registration(**(runtime or {}))
    if found.problem:
        yield fail(found.problem)
        return
    if not found.writes or not found.platform or found.platform["name"] != "k0s":
        host.noop("k0s' containerd has the nvidia runtime config")
        return
    unit = found.platform["unit"]
    node = host.get_fact(K0sContainerd)
    old = _k0s_pid(node["processes"], unit)
    if not unit or old is None:
        yield fail(
            f"containerd config not changed: no containerd process runs in the k0s unit ({unit or 'none found'})"
        )
        return
    previous = host.get_fact(K0sCriLoaded, pid=old)
    text = found.writes[k0s.DROPIN]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    backup = f"{containerd.BACKUP_DIR}/{k0s.BACKUP_NAME}-{stamp}.tar"
    yield _k0s_backup(backup)
    if state.is_executing:
        logger.info("%s%s", host.print_prefix, k0s.write_line(unit))
    yield from write_file(k0s.DROPIN, text, mode=found.modes.get(k0s.DROPIN, "644"))
    ticks = str((max(1, int(timeout)) + 2 * k0s.DEBOUNCE_SECONDS) * 5)
    yield StringCommand(shell.command(_K0S_WAIT, "gpunode-k0s-wait", unit, str(old), ticks, K0S_SOCKET))
    written = host.get_fact(K0sContainerd)
    summary = summarize(written["dump"]["dump"] if written["dump"] and not written["dump"]["error"] else {})
    mode = (runtime or {}).get("mode", "runtime")
    expected = expected_after_restart(summary, previous, runtime_expected=mode != "nri")
    problem, new = _k0s_problem(written["processes"], unit, old, expected)
    if problem is None:
        logger.info("%sk0s restarted its containerd (pid %s) and it is verified", host.print_prefix, new)
        return
    failed = f"k0s' containerd failed after the write of {k0s.DROPIN}: {problem}"
    yield containerd._restore(backup, [K0S_DROPINS], [k0s.DROPIN], f"{failed}; restoring {backup} failed")
    now = _k0s_pid(host.get_fact(K0sContainerd)["processes"], unit)
    yield StringCommand(shell.command(_K0S_WAIT, "gpunode-k0s-wait", unit, str(now or 0), ticks, K0S_SOCKET))
    back, _ = _k0s_problem(host.get_fact(K0sContainerd)["processes"], unit, now or 0, previous)
    if back is None:
        yield fail(
            f"{failed}; {K0S_DROPINS} was put back as the backup taken before the write holds it, "
            "and k0s' containerd runs it again"
        )
    else:
        yield fail(f"{failed}; after putting back the backup taken before the write: {back}")


def _k0s_backup(path: str) -> StringCommand:
    """Save ``/etc/k0s/containerd.d`` in the tar ``path`` (mode 0600, in a 0700 directory)."""
    partial = f"{path}.partial"
    return StringCommand(
        "umask", "077", "&&", "install", "-d", "-m", "0700", QuoteString(posixpath.dirname(path)), "&&",
        "tar", "-C", "/", "--ignore-failed-read", "-cf", QuoteString(partial), QuoteString(K0S_DROPINS.lstrip("/")),
        "&&", "mv", "-f", QuoteString(partial), QuoteString(path),
    )  # fmt: skip


def _k0s_pid(processes: dict[int, str], unit: str | None) -> int | None:
    """The containerd process in the k0s unit (the newest where there are several)."""
    pids = [pid for pid, where in processes.items() if unit and where == unit]
    return max(pids) if pids else None


def _k0s_problem(
    processes: dict[int, str], unit: str | None, old: int, expected: CriLoaded
) -> tuple[str | None, int | None]:
    """Why k0s' containerd is not what ``expected`` says after a change (no process other than ``old``
    in ``unit``, a CRI plugin without the expected runtimes), or ``None``; and the new process."""
    new = _k0s_pid({pid: where for pid, where in processes.items() if pid != old}, unit)
    if new is None:
        return f"k0s did not start a new containerd in {unit} (the previous one was pid {old or 'none'})", None
    loaded = host.get_fact(K0sCriLoaded, pid=new)
    return restart_problem("active", "", loaded, expected), new
