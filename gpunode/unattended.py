"""apt drop-in for unattended-upgrades on a GPU node, and parsing of ``apt-config dump`` (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pyinfra_gpunode.settings import UNATTENDED_BLACKLIST

MODES = ("disabled", "blacklist")
DEFAULT_BLACKLIST = UNATTENDED_BLACKLIST
TIMERS = ("apt-daily-upgrade.timer", "apt-daily.timer")
SERVICE = "unattended-upgrades.service"

_PREFIX = re.compile(r"^[a-z0-9][a-z0-9.+-]*\Z")
_DUMP = re.compile(r'^(?P<key>\S+)\s+"(?P<value>.*)";$')


def check_blacklist(entries: Sequence[str]) -> None:
    """Raise ``ValueError`` naming an entry that is not a package-name prefix."""
    for entry in entries:
        if not isinstance(entry, str) or not _PREFIX.match(entry):
            raise ValueError(f"blacklist entries must be package-name prefixes like 'nvidia-', got {entry!r}")


def render_apt_conf(mode: str, blacklist: Sequence[str] = DEFAULT_BLACKLIST) -> str:
    """The apt.conf.d drop-in for ``mode`` (``disabled`` or ``blacklist``); byte-stable."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    lines = ["// Managed by pyinfra-gpunode: unattended upgrades on a GPU node."]
    if mode == "disabled":
        lines += [
            'APT::Periodic::Enable "0";',
            'APT::Periodic::Update-Package-Lists "0";',
            'APT::Periodic::Unattended-Upgrade "0";',
        ]
    else:
        check_blacklist(blacklist)
        lines += [
            'APT::Periodic::Update-Package-Lists "1";',
            'APT::Periodic::Unattended-Upgrade "1";',
            "// Regular expressions matched from the start of package names.",
            "Unattended-Upgrade::Package-Blacklist {",
        ]
        lines += [f'    "{entry.replace("+", chr(92) + "+")}";' for entry in dict.fromkeys(blacklist)]
        lines += ["};"]
    return "\n".join(lines) + "\n"


def parse_apt_config_dump(lines: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """``(periodic, blacklist)`` from ``apt-config dump`` lines.

    ``periodic`` maps ``APT::Periodic::<Name>`` to its value (last assignment wins, as in apt);
    ``blacklist`` lists ``Unattended-Upgrade::Package-Blacklist`` entries in order.
    """
    periodic: dict[str, str] = {}
    blacklist: list[str] = []
    for line in lines:
        match = _DUMP.match(line.strip())
        if not match:
            continue
        key, value = match.group("key"), match.group("value")
        if key.startswith("APT::Periodic::") and value != "":
            periodic[key[len("APT::Periodic::") :]] = value
        elif key == "Unattended-Upgrade::Package-Blacklist::":
            blacklist.append(value)
    return periodic, blacklist


def unattended_enabled(periodic: dict[str, str]) -> bool:
    """Whether apt's daily job would run unattended-upgrade with these settings."""
    if periodic.get("Enable", "1") == "0":
        return False
    value = periodic.get("Unattended-Upgrade", "0")
    return value not in ("0", "")
