"""Controller-side hooks around a node's rollout turn: checked argv templates, placeholders, environment (no I/O)."""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyinfra_gpunode.hostdata import NODE_NAME_MAX, HostDataError, is_node_name
from pyinfra_gpunode.log import printable, shown

PLACEHOLDERS = ("node", "hostname")
HOOK_KEYS = ("gpunode_rollout_before", "gpunode_rollout_after")


def node_name_problem(hostname: str) -> str | None:
    """Why ``hostname`` (read from the node) may not reach a hook as ``{hostname}`` or ``GPUNODE_HOSTNAME``,
    or ``None`` when it is a valid Kubernetes node name (RFC 1123 subdomain, at most 253 characters)."""
    if is_node_name(hostname):
        return None
    return (
        f"the node's hostname {shown(hostname)} is not a valid Kubernetes node name (lowercase letters, "
        f"digits, '-' and '.', starting and ending with a letter or digit, at most {NODE_NAME_MAX} characters): "
        "no hook is given it"
    )


def change_lines(changes: Sequence[str]) -> list[str]:
    """The turn's planned changes as a hook's environment carries them: one printable line each (they
    hold versions and paths read from the node; anything else is shown as ``<U+001B>``)."""
    return [printable(change) for change in changes]


def placeholders(argument: str) -> list[str]:
    """The ``{name}`` fields of one argument (``{{`` and ``}}`` are braces); ``ValueError`` on unbalanced ones."""
    return [field for _, field, _, _ in string.Formatter().parse(argument) if field is not None]


def check_hook(key: str, value: Any, which: Callable[[str], str | None]) -> list[str]:
    """``value`` as a hook's argv (``[]``: no hook), or ``HostDataError`` naming ``key``.

    ``which`` finds a program on the controller (``shutil.which``): the hook's first element
    must name one that exists, without placeholders.
    """
    if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        raise HostDataError(f"host-data key {key!r} must be a list of strings (the hook's argv), got {value!r}")
    if not value:
        return []
    for argument in value:
        try:
            fields = placeholders(argument)
        except ValueError as exc:
            raise HostDataError(f"host-data key {key!r}: {argument!r} has unbalanced braces ({exc})") from exc
        unknown = [field for field in fields if field not in PLACEHOLDERS]
        if unknown:
            raise HostDataError(
                f"host-data key {key!r}: unknown placeholder {{{unknown[0]}}} in {argument!r} "
                f"(known: {', '.join('{' + name + '}' for name in PLACEHOLDERS)})"
            )
    program = value[0]
    if not program or placeholders(program):
        raise HostDataError(f"host-data key {key!r}: the program (first element) must be a plain name, got {program!r}")
    if which(program) is None:
        raise HostDataError(f"host-data key {key!r}: program {program!r} is not found on the controller")
    return list(value)


def hook_argv(template: Sequence[str], node: str, hostname: str) -> list[str]:
    """``template`` with ``{node}`` (the inventory name) and ``{hostname}`` (the node's own, which
    ``node_name_problem`` accepted) filled in."""
    return [argument.format(node=node, hostname=hostname) for argument in template]


def hook_environment(
    base: Mapping[str, str],
    which: str,
    node: str,
    hostname: str,
    changes: Sequence[str],
    turn: str = "1/1",
    batch: str = "batch 1/1",
    driver: tuple[str, str] = ("", ""),
) -> dict[str, str]:
    """The hook's environment: ``base`` (the controller's) plus what this turn is about.

    ``GPUNODE_HOOK`` (before/after), ``GPUNODE_NODE``, ``GPUNODE_HOSTNAME``, ``GPUNODE_CHANGES``
    (the turn's planned changes, one a line), ``GPUNODE_DRIVER_CHANGE`` (``1`` when the
    turn changes the driver, else ``0``), ``GPUNODE_DRIVER_FROM`` and ``GPUNODE_DRIVER_TO`` (``driver``:
    the version of the driver module loaded before the turn, and of the driver the turn installs or
    reboots into; empty where none or where the turn leaves the driver alone), ``GPUNODE_TURN``
    (``k/n``: the rollout's k-th of n turns) and ``GPUNODE_BATCH`` (its group: ``canary k/n``,
    ``batch k/n`` or ``resumed k/n``).
    """
    return {
        **base,
        "GPUNODE_HOOK": which,
        "GPUNODE_NODE": node,
        "GPUNODE_HOSTNAME": hostname,
        "GPUNODE_CHANGES": "\n".join(change_lines(changes)),
        "GPUNODE_DRIVER_CHANGE": "1" if any(change.startswith("driver") for change in changes) else "0",
        "GPUNODE_DRIVER_FROM": printable(driver[0]),  # the loaded module's version: the node's text, as in the changes
        "GPUNODE_DRIVER_TO": printable(driver[1]),
        "GPUNODE_TURN": turn,
        "GPUNODE_BATCH": batch,
    }


def shown_argv(argv: Sequence[str]) -> str:
    """A hook's argv as the plan and the log show it: each argument as it is, one that is empty or holds
    white space in quotes."""
    return " ".join(repr(arg) if not arg or any(c.isspace() for c in arg) else arg for arg in argv)
