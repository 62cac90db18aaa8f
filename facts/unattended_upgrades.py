"""Facts about unattended upgrades and needrestart: installed, periodic settings, timers, blacklist, restarts."""

from __future__ import annotations

import shlex
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode.needrestart import NeedrestartInfo, parse_needrestart_conf
from pyinfra_gpunode.sections import dpkg_query, marker, parse_dpkg_status, split_sections
from pyinfra_gpunode.unattended import SERVICE, TIMERS, parse_apt_config_dump, unattended_enabled

APT_CONF = "/etc/apt/apt.conf.d/99gpunode-unattended-upgrades"
NEEDRESTART_CONF = "/etc/needrestart/conf.d/90-gpunode.conf"


class UnattendedUpgradesInfo(TypedDict):
    """``UnattendedUpgradesState``'s value."""

    unattended_upgrades_installed: bool
    needrestart_installed: bool
    periodic: dict[str, str]
    unattended_enabled: bool
    blacklist: list[str]
    units: dict[str, str]
    needrestart: NeedrestartInfo
    apt_conf: str | None
    needrestart_conf: str | None


class UnattendedUpgradesState(FactBase[UnattendedUpgradesInfo]):
    """
    Returns unattended-upgrades and needrestart state in one read: which are installed,
    ``APT::Periodic`` settings and the package blacklist as ``apt-config dump`` resolves them,
    ``systemctl is-enabled`` of apt's timers and the unattended-upgrades service, needrestart's
    effective restart mode and whether containerd and kubelet are never restarted by it, and
    the content of this library's own drop-ins (None when absent).

    .. code:: python

        {
            "unattended_upgrades_installed": True,
            "needrestart_installed": False,
            "periodic": {"Update-Package-Lists": "1", "Unattended-Upgrade": "1"},
            "unattended_enabled": True,
            "blacklist": [],
            "units": {"apt-daily-upgrade.timer": "enabled", "apt-daily.timer": "enabled",
                      "unattended-upgrades.service": "enabled"},
            "needrestart": {"mode": None, "excluded": []},
            "apt_conf": None,
            "needrestart_conf": None,
        }
    """

    @override
    def command(self, apt_conf: str = APT_CONF, needrestart_conf: str = NEEDRESTART_CONF) -> str:
        units = " ".join((*TIMERS, SERVICE))
        return "; ".join(
            [
                marker("packages"),
                dpkg_query("unattended-upgrades", "needrestart"),
                marker("dump"),
                "apt-config dump 2>/dev/null | grep -E '^(APT::Periodic|Unattended-Upgrade::Package-Blacklist)'"
                " || true",
                marker("units"),
                f"for unit in {units}; do "
                'printf "%s=%s\\n" "$unit" "$(systemctl is-enabled "$unit" 2>/dev/null)"; done',
                marker("needrestart"),
                "for f in /etc/needrestart/needrestart.conf /etc/needrestart/conf.d/*.conf; do "
                'if [ -f "$f" ]; then '
                "grep -hE '^[[:space:]]*([$]nrconf[{](restart|override_rc)[}]|qr[(].*[)][[:space:]]*=>)' \"$f\"; "
                "fi; done || true",
                f"if [ -f {shlex.quote(apt_conf)} ]; then {marker('apt_conf')}; cat {shlex.quote(apt_conf)}; fi",
                f"if [ -f {shlex.quote(needrestart_conf)} ]; then {marker('needrestart_conf')}; "
                f"cat {shlex.quote(needrestart_conf)}; fi",
            ]
        )

    @override
    def process(self, output: list[str]) -> UnattendedUpgradesInfo:
        sections = split_sections(output)
        packages = parse_dpkg_status(sections.get("packages", []))
        periodic, blacklist = parse_apt_config_dump(sections.get("dump", []))
        units = {}
        for line in sections.get("units", []):
            name, _, value = line.partition("=")
            if name:
                units[name] = value.strip()

        def text(name: str) -> str | None:
            if name not in sections:
                return None
            return "\n".join(sections[name]) + "\n"

        return {
            "unattended_upgrades_installed": "unattended-upgrades" in packages,
            "needrestart_installed": "needrestart" in packages,
            "periodic": periodic,
            "unattended_enabled": unattended_enabled(periodic),
            "blacklist": blacklist,
            "units": units,
            "needrestart": parse_needrestart_conf(sections.get("needrestart", [])),
            "apt_conf": text("apt_conf"),
            "needrestart_conf": text("needrestart_conf"),
        }
