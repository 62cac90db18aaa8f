"""needrestart drop-in that keeps it from restarting the container runtime on its own (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TypedDict

from pyinfra_gpunode.settings import NEEDRESTART_KEEP

DEFAULT_KEEP = NEEDRESTART_KEEP
_UNIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@_.-]*\Z")
_RESTART = re.compile(r"""^\s*\$nrconf\{restart\}\s*=\s*['"](?P<mode>[a-z])['"]\s*;""")
_OVERRIDE = re.compile(
    r"""^\s*(?:\$nrconf\{override_rc\}\{qr\((?P<rx>[^)]*)\)\}\s*=\s*0\s*;|qr\((?P<rx2>[^)]*)\)\s*=>\s*0\b)"""
)


def check_services(services: Sequence[str]) -> None:
    """Raise ``ValueError`` naming a service that is not a plain unit name."""
    for service in services:
        if not isinstance(service, str) or not _UNIT.match(service) or service.endswith(".service"):
            raise ValueError(f"services are unit names without '.service', like 'containerd', got {service!r}")


def render_needrestart_conf(keep: Sequence[str] = DEFAULT_KEEP) -> str:
    """The ``/etc/needrestart/conf.d`` drop-in: list-only mode, never restart ``keep`` or ``nvidia-*``."""
    check_services(keep)
    lines = [
        "# Managed by pyinfra-gpunode: needrestart only lists services on this GPU node",
        "# and never restarts the container runtime, kubelet or NVIDIA services itself.",
        "$nrconf{restart} = 'l';",
    ]
    for service in dict.fromkeys(keep):
        lines.append(f"$nrconf{{override_rc}}{{qr(^{re.escape(service)}\\.service$)}} = 0;")
    lines.append("$nrconf{override_rc}{qr(^nvidia-)} = 0;")
    return "\n".join(lines) + "\n"


class NeedrestartInfo(TypedDict):
    mode: str | None  # the effective $nrconf{restart}, None when unset
    excluded: list[str]  # the services it never restarts


def parse_needrestart_conf(lines: Iterable[str], services: Sequence[str] = DEFAULT_KEEP) -> NeedrestartInfo:
    """Effective restart mode (last assignment wins) and which ``services`` are never restarted.

    ``lines`` are needrestart.conf followed by conf.d/*.conf in the order needrestart reads them.
    """
    mode: str | None = None
    patterns: list[str] = []
    for line in lines:
        if line.lstrip().startswith("#"):
            continue
        match = _RESTART.match(line)
        if match:
            mode = match.group("mode")
        match = _OVERRIDE.match(line)
        if match:
            patterns.append(match.group("rx") or match.group("rx2"))
    excluded = []
    for service in services:
        unit = f"{service}.service"
        for rx in patterns:
            try:
                if re.search(rx, unit):
                    excluded.append(service)
                    break
            except re.error:
                continue
    return {"mode": mode, "excluded": excluded}
