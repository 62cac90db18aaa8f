"""Keep unattended upgrades and needrestart from changing a GPU node behind the operator's back."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from pyinfra_gpunode.facts.unattended_upgrades import APT_CONF, NEEDRESTART_CONF, UnattendedUpgradesState
from pyinfra_gpunode.needrestart import DEFAULT_KEEP, render_needrestart_conf
from pyinfra_gpunode.operations._atomic import write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.settings import UNATTENDED_MODE
from pyinfra_gpunode.unattended import DEFAULT_BLACKLIST, MODES, SERVICE, TIMERS, render_apt_conf


def _systemctl(persist: str, now: str, units: list[str]) -> StringCommand:
    """``systemctl enable|disable`` the units, and start|stop them when systemd is running (not in a chroot)."""
    quoted = [QuoteString(unit) for unit in units]
    return StringCommand(
        "systemctl", persist, *quoted, "&&", "if", "[", "-d", "/run/systemd/system", "];", "then",
        "systemctl", now, *quoted, ";", "fi",
    )  # fmt: skip


@operation()
@locked_before_changes
def configured(
    mode: str = UNATTENDED_MODE,
    blacklist: Sequence[str] = DEFAULT_BLACKLIST,
    needrestart_keep: Sequence[str] = DEFAULT_KEEP,
) -> Generator[Any, Any, None]:
    """
    Configure unattended upgrades and needrestart for a GPU node.

    + mode: ``disabled`` (apt's periodic jobs off, their timers and the unattended-upgrades
      service disabled) or ``blacklist`` (security updates keep coming, except for the
      blacklisted packages; timers enabled)
    + blacklist: package-name prefixes unattended-upgrades must never upgrade (``blacklist`` mode)
    + needrestart_keep: services needrestart must never restart on its own (``nvidia-*`` is
      always kept); needrestart is set to list-only mode

    The settings go into ``/etc/apt/apt.conf.d/99gpunode-unattended-upgrades`` (sorted last,
    so it wins) and ``/etc/needrestart/conf.d/90-gpunode.conf`` (written even where needrestart
    is not installed yet, so a later install cannot restart containerd).

    **Example:**

    .. code:: python

        unattended_upgrades.configured(name="No unattended upgrades on GPU nodes")
        unattended_upgrades.configured(name="Security updates, but not the GPU stack", mode="blacklist")
    """
    if mode not in MODES:
        raise OperationValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    try:
        apt_text = render_apt_conf(mode, list(blacklist))
        needrestart_text = render_needrestart_conf(list(needrestart_keep))
    except ValueError as exc:
        raise OperationValueError(str(exc)) from exc

    state = node_fact(UnattendedUpgradesState, apt_conf=APT_CONF, needrestart_conf=NEEDRESTART_CONF)
    changed = False
    if state["apt_conf"] != apt_text:
        changed = True
        yield from write_file(APT_CONF, apt_text)
    if state["needrestart_conf"] != needrestart_text:
        changed = True
        yield from write_file(NEEDRESTART_CONF, needrestart_text)

    units = state["units"]
    if mode == "disabled":
        wanted = [u for u in (*TIMERS, SERVICE) if units.get(u, "").startswith("enabled")]
        if wanted:
            changed = True
            yield _systemctl("disable", "stop", wanted)
    else:
        wanted = [u for u in TIMERS if units.get(u) == "disabled"]
        if state["unattended_upgrades_installed"] and units.get(SERVICE) == "disabled":
            wanted.append(SERVICE)
        if wanted:
            changed = True
            yield _systemctl("enable", "start", wanted)

    if not changed:
        host.noop(f"unattended-upgrades mode is {mode}; needrestart never restarts {', '.join(needrestart_keep)}")
