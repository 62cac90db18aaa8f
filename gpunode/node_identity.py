"""Which Kubernetes node a host of the inventory is, decided on the controller's side (no I/O).

The name a hook is given (``{hostname}``, ``GPUNODE_HOSTNAME``) drives controller-side commands such as
``kubectl drain``: a node that names itself after another node must never get that other node drained.
So the name is host data where given (``gpunode_node_name``) and is checked against what the node reports
(its hostname as the kubelet registers it, lowercased, or the kubelet's ``--hostname-override``); without
it, the node's report is used where it is a valid node name. Across the hosts of one run, two with one node
name, or one machine under two inventory names (one ``/etc/machine-id`` and one boot id: nodes cloned from
an image that kept its machine id boot with boot ids of their own), fail before any hook runs, naming each
other.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TypedDict

from pyinfra_gpunode.hooks import node_name_problem, placeholders
from pyinfra_gpunode.log import shown

# Where kubeadm, distribution packages and image builders pass the kubelet its flags.
KUBELET_FLAG_FILES = ("/var/lib/kubelet/kubeadm-flags.env", "/etc/default/kubelet", "/etc/sysconfig/kubelet")
_OVERRIDE = re.compile(r"--hostname-override(?:=|\s+)(\S+)")
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SHOWN_NAMES = 5  # other inventory names a shared name or machine lists


class Reported(TypedDict):
    """What a node says about itself: its kernel hostname, the kubelet's ``--hostname-override`` where its
    flag files set one, its ``/etc/machine-id`` and the kernel's boot id (each ``""`` where absent or not
    one)."""

    hostname: str
    override: str | None
    machine_id: str
    boot_id: str


def reported(hostname: str, override: str | None = None, machine: str = "", boot: str = "") -> Reported:
    return {"hostname": hostname, "override": override, "machine_id": machine, "boot_id": boot}


def machine_of(found: Reported) -> str:
    """The running machine a node's report names (machine id and boot id), or ``""`` without a machine id."""
    if not found["machine_id"]:
        return ""
    return f"{found['machine_id']}, boot {found['boot_id']}" if found["boot_id"] else found["machine_id"]


def kubelet_override(flag_lines: list[str]) -> str | None:
    """The last ``--hostname-override`` in the kubelet's flag files' lines (``KUBELET_KUBEADM_ARGS="..."``),
    unquoted, or None."""
    found = None
    for line in flag_lines:
        for match in _OVERRIDE.finditer(line):
            try:
                words = shlex.split(match.group(1))
            except ValueError:
                words = [match.group(1).strip("\"'")]
            found = words[0] if words else None
    return found


def machine_id(text: str) -> str:
    """``/etc/machine-id``'s id, or ``""`` where the file holds none (empty, ``uninitialized``, garbage)."""
    text = text.strip()
    return text if _MACHINE_ID.fullmatch(text) else ""


def boot_id(text: str) -> str:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``), or ``""`` where it reads as none."""
    text = text.strip()
    return text if _BOOT_ID.fullmatch(text) else ""


def node_name(inventory_name: str, explicit: str | None, reported: Reported) -> tuple[str, str | None]:
    """``(the node's Kubernetes name, None)``, or ``("", why)`` where no name may reach its hooks: the
    host data's ``explicit`` name where the node answers to it, else the name the kubelet registers
    (its override, or the hostname lowercased) where that is a valid node name."""
    answers = [name for name in (reported["override"], reported["hostname"].lower()) if name]
    if explicit:
        if explicit in answers:
            return explicit, None
        said = " nor ".join(shown(name) for name in answers) or "no name"
        return "", (
            f"gpunode_node_name {explicit!r} for {inventory_name} is not the node's name: it reports {said} "
            "(hostname, kubelet --hostname-override); no hook runs against a node that may be another"
        )
    name = answers[0] if answers else ""
    problem = node_name_problem(name)
    return (name, None) if problem is None else ("", problem)


def hook_name(
    inventory_name: str, explicit: str | None, hooks: Sequence[str], reported: Reported
) -> tuple[str, str | None]:
    """``node_name`` for a node whose hooks are ``hooks`` (their arguments): a reported name that is no node
    name refuses the node only where a hook names ``{hostname}`` (it would reach the controller's commands),
    and is given to no hook otherwise; an ``explicit`` name the node does not answer to always refuses it."""
    name, refused = node_name(inventory_name, explicit, reported)
    if refused is None or explicit:
        return name, refused
    asked = any("hostname" in placeholders(argument) for argument in hooks)
    return "", refused if asked else None


def shared(values: Mapping[str, str], what: str) -> dict[str, str]:
    """For each inventory name whose value (node name, machine id) another inventory name of the run has
    too, why neither may take a turn; ``""`` values are never shared."""
    holders: dict[str, list[str]] = {}
    for name, value in values.items():
        if value:
            holders.setdefault(value, []).append(name)
    problems = {}
    for value, names in holders.items():
        if len(names) > 1:
            for name in names:
                rest = [other for other in names if other != name]
                more = f" and {len(rest) - SHOWN_NAMES} more" if len(rest) > SHOWN_NAMES else ""
                others = ", ".join(rest[:SHOWN_NAMES]) + more
                problems[name] = f"{what} {shown(value)} is {others}'s too: no turn for either until each is one node"
    return problems
