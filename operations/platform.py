"""Nodes whose containerd a platform (k3s, RKE2, k0s, EKS nodeadm) owns: refused before anything changes on
them, except k3s and RKE2 where they add the nvidia runtime themselves (their unit restarted when due, a
drop-in for what host data asks beyond it), and k0s, which takes gpunode's drop-in."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_gpunode import k0s, rancher, shell
from pyinfra_gpunode.containerd_dump import CriLoaded, expected_after_restart, restart_problem, summarize
from pyinfra_gpunode.facts.k0s import K0sContainerd, K0sCriLoaded
from pyinfra_gpunode.facts.platform import ContainerdPlatform
from pyinfra_gpunode.facts.rancher import RancherContainerd, RancherContainerdInfo, RancherCriLoaded
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import containerd
from pyinfra_gpunode.operations._atomic import fail, write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.platform import (
    K0S_DROPINS,
    K0S_SOCKET,
    K3S_SOCKET,
    NAMES,
    RANCHER,
    ContainerdPlatformInfo,
    rancher_config,
    rancher_log,
    rancher_nvidia,
    rancher_restart_reason,
    refusal,
)
from pyinfra_gpunode.settings import RESTART_TIMEOUT

_RESTART_AND_VERIFY = shell.script(Path(__file__).parent / "shell" / "platform-restart.sh")
# Wait for a platform's new containerd after a change in its drop-in directory (shell/platform-wait.sh).
_PLATFORM_WAIT = shell.script(Path(__file__).parent / "shell" / "platform-wait.sh")


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
      is refused where any of them would go unapplied (no drop-in in the agent's ``config-v3.toml.d``
      applies them: containerd 1.x, a version-2 generated config, another binary), each named with the
      agent's own way to get it

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
    left unapplied, ``containerd.rancher_refusal``; on a k0s node whose config k0s manages,
    ``k0s.layout_problem`` from k0s' own containerd and files), or ``None``. Reads only."""
    found = node_fact(ContainerdPlatform)
    problem = refusal(found) or containerd.rancher_refusal(found, requests or {})
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


@dataclass(frozen=True)
class _Site:
    """Where a platform's containerd reads our drop-in, how it is restarted after a change and read after it:
    decided once per platform in ``_site``."""

    label: str  # who restarts containerd: "k0s", "k3s", "RKE2"
    unit: str
    dropins: str  # the drop-in directory, saved before the write and put back on failure
    path: str  # our drop-in
    bin_dir: str  # the platform's ctr, for the wait
    address: str  # its containerd's socket
    backup_name: str  # backups: <BACKUP_DIR>/<backup_name>-<time>.tar
    restarts_itself: bool  # k0s restarts its containerd on a change to its drop-ins; k3s and RKE2: their unit is
    adds_runtime: bool  # the agent itself adds the nvidia runtime (k3s, RKE2): expected in NRI mode as well
    log: str | None  # k3s and RKE2 send their containerd's output there (its CRI start line)
    tree: Callable[[], RancherContainerdInfo]  # the platform's containerd files, dump, processes, log size
    loaded: Callable[[int, int], CriLoaded]  # what containerd ``pid``'s CRI plugin loaded (log past ``offset``)

    @property
    def containerd(self) -> str:
        """The platform's containerd, as messages name it: "k0s' containerd", "RKE2's containerd"."""
        return f"{self.label}' containerd" if self.label.endswith("s") else f"{self.label}'s containerd"


def _site(info: ContainerdPlatformInfo | None) -> _Site | None:
    """Where the platform of ``info`` takes our drop-in, or ``None`` (no platform, or one that takes none)."""
    if not info or not info["unit"]:
        return None
    name, unit = info["name"], info["unit"]
    if name == "k0s":
        return _Site(
            "k0s", unit, K0S_DROPINS, k0s.DROPIN, k0s.BIN_DIR, K0S_SOCKET, k0s.BACKUP_NAME,
            restarts_itself=True, adds_runtime=False, log=None, tree=_k0s_tree, loaded=_k0s_loaded,
        )  # fmt: skip
    if name in RANCHER:
        return _Site(
            NAMES[name], unit, rancher.dropin_dir(name), rancher.dropin_path(name), rancher.bin_dir(name),
            K3S_SOCKET, rancher.BACKUP_NAME, restarts_itself=False, adds_runtime=True, log=rancher_log(name),
            tree=partial(_rancher_tree, name), loaded=partial(_rancher_loaded, name),
        )  # fmt: skip
    return None


def _k0s_tree() -> RancherContainerdInfo:
    return {**host.get_fact(K0sContainerd), "log_size": 0}


def _k0s_loaded(pid: int, offset: int) -> CriLoaded:
    return host.get_fact(K0sCriLoaded, pid=pid)


def _rancher_tree(program: str) -> RancherContainerdInfo:
    return host.get_fact(RancherContainerd, program=program)


def _rancher_loaded(program: str, pid: int, offset: int) -> CriLoaded:
    return host.get_fact(RancherCriLoaded, program=program, offset=offset)


@operation(
    is_idempotent=False,
    idempotent_notice="Writes, and so restarts the platform's containerd, only while the drop-in differs.",
)
@locked_before_changes
def runtime_dropin_applied(
    timeout: int = RESTART_TIMEOUT, runtime: dict[str, Any] | None = None
) -> Generator[Any, Any, None]:
    """
    Write gpunode's containerd drop-in where a platform owns containerd, and restart and verify the
    platform's containerd: on a k0s node the nvidia runtime in ``/etc/k0s/containerd.d/nvidia-gpunode.toml``,
    which k0s answers by restarting its containerd (the write is the restart; the kubelet keeps running);
    on a k3s or RKE2 node whose agent adds the nvidia runtime itself, what host data asks beyond it
    (nvidia as default runtime, CDI, SystemdCgroup, NRI) in
    ``/var/lib/rancher/<program>/agent/etc/containerd/config-v3.toml.d/90-gpunode-nvidia.toml``, then the
    agent's unit restarted (the kubelet restarts with it). Call it only in the node's turn (the rollout
    does, after the before-hook).

    + timeout: seconds the platform's new containerd may take (on k0s, once k0s restarted it about 3 s
      after the write) to bring its CRI plugin up on its socket
    + runtime: ``containerd.nvidia_runtime``'s arguments (the drop-in is planned and judged as there,
      by the platform's own containerd on a staged copy of its tree)

    First the drop-in directory is saved in a tar readable by root only (under
    ``/var/lib/pyinfra-gpunode/backup``), then the drop-in is written and the new containerd
    process under the platform's unit (another PID than before) is verified as
    ``containerd.restarted_if_pending`` verifies containerd.service: its CRI plugin loaded every runtime
    of the merged config, nvidia included, the merged config's default runtime and every runtime the
    previous process had (from its start line: in the journal on k0s, the last one the agent's
    ``containerd.log`` holds past its size before the restart on k3s and RKE2; else ``ctr plugins ls`` on
    the platform's socket). On failure the directory is put back as the tar holds it (our file removed,
    or restored), containerd is restarted again (k0s does so itself; the agent's unit is restarted), that
    restart is verified against the previous process, and the host fails with both findings. Where the
    drop-in already says what is planned it does nothing, and a refused node fails naming why.

    **Example:**

    .. code:: python

        platform.runtime_dropin_applied(name="k0s: nvidia runtime drop-in written and verified", timeout=60)
    """
    found = containerd.registration(**(runtime or {}))
    if found.problem:
        yield fail(found.problem)
        return
    site = _site(found.platform)
    if not found.writes or site is None or site.path not in found.writes:
        host.noop("the platform's containerd has the config host data asks for")
        return
    node = site.tree()
    old = _newest(node["processes"], site.unit)
    if old is None:
        yield fail(f"containerd config not changed: no containerd process runs in the {site.label} unit ({site.unit})")
        return
    previous = site.loaded(old, 0)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    backup = f"{containerd.BACKUP_DIR}/{site.backup_name}-{stamp}.tar"
    yield _backup(backup, site.dropins)
    if state.is_executing:
        logger.info("%s%s", host.print_prefix, found.note)
    yield from write_file(site.path, found.writes[site.path], mode=found.modes.get(site.path, "644"))
    offset = node["log_size"]
    yield from _restarted(site, old, offset, timeout)
    written = site.tree()
    summary = summarize(written["dump"]["dump"] if written["dump"] and not written["dump"]["error"] else {})
    mode = (runtime or {}).get("mode", "runtime")
    expected = expected_after_restart(summary, previous, runtime_expected=mode != "nri" or site.adds_runtime)
    problem, new = _site_problem(site, written["processes"], old, expected, offset)
    if problem is None:
        logger.info("%s%s restarted its containerd (pid %s) and it is verified", host.print_prefix, site.label, new)
        return
    failed = f"{site.containerd} failed after the write of {site.path}: {problem}"
    yield containerd._restore(backup, [site.dropins], [site.path], f"{failed}; restoring {backup} failed")
    now_node = site.tree()
    now, now_offset = _newest(now_node["processes"], site.unit), now_node["log_size"]
    yield from _restarted(site, now or 0, now_offset, timeout)
    back, _ = _site_problem(site, site.tree()["processes"], now or 0, previous, now_offset)
    if back is None:
        yield fail(
            f"{failed}; {site.dropins} was put back as the backup taken before the write holds it, "
            f"and {site.containerd} runs it again"
        )
    else:
        yield fail(f"{failed}; after putting back the backup taken before the write: {back}")


def _restarted(site: _Site, old: int, offset: int, timeout: int) -> Iterator[StringCommand]:
    """Restart the platform's containerd where the write does not (k3s and RKE2: their unit, without waiting
    on systemd), then wait for a new containerd process in its unit to report its CRI plugin."""
    seconds = max(1, int(timeout)) + (2 * k0s.DEBOUNCE_SECONDS if site.restarts_itself else 0)
    log = [site.log, str(int(offset))] if site.log else []
    if not site.restarts_itself:
        yield StringCommand(
            "systemctl", "reset-failed", QuoteString(site.unit), "2>/dev/null", ";",
            "systemctl", "restart", "--no-block", QuoteString(site.unit),
        )  # fmt: skip
    yield StringCommand(
        shell.command(
            _PLATFORM_WAIT,
            "gpunode-platform-wait",
            site.unit,
            str(old),
            str(seconds * 5),
            site.address,
            site.bin_dir,
            *log,
        )
    )


def _backup(path: str, directory: str) -> StringCommand:
    """Save ``directory`` in the tar ``path`` (mode 0600, in a 0700 directory); a missing one is left out."""
    partial = f"{path}.partial"
    return StringCommand(
        "umask", "077", "&&", "install", "-d", "-m", "0700", QuoteString(posixpath.dirname(path)), "&&",
        "tar", "-C", "/", "--ignore-failed-read", "-cf", QuoteString(partial), QuoteString(directory.lstrip("/")),
        "&&", "mv", "-f", QuoteString(partial), QuoteString(path),
    )  # fmt: skip


def _newest(processes: dict[int, str], unit: str | None) -> int | None:
    """The containerd process in the platform's unit (the newest where there are several)."""
    pids = [pid for pid, where in processes.items() if unit and where == unit]
    return max(pids) if pids else None


def _site_problem(
    site: _Site, processes: dict[int, str], old: int, expected: CriLoaded, offset: int
) -> tuple[str | None, int | None]:
    """Why the platform's containerd is not what ``expected`` says after a change (no process other than
    ``old`` in its unit, a CRI plugin without the expected runtimes), or ``None``; and the new process."""
    new = _newest({pid: where for pid, where in processes.items() if pid != old}, site.unit)
    if new is None:
        return (
            f"{site.label} did not start a new containerd in {site.unit} (the previous one was pid {old or 'none'})",
            None,
        )
    return restart_problem("active", "", site.loaded(new, offset), expected), new
