"""Facts about unattended upgrades and needrestart: installed, periodic settings, timers, blacklist, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.needrestart import NeedrestartInfo, parse_needrestart_conf
from pyinfra_gpunode.sections import DPKG_FORMAT, MARK, parse_dpkg_status, split_sections
from pyinfra_gpunode.unattended import SERVICE, TIMERS, parse_apt_config_dump, unattended_enabled

APT_CONF = "/etc/apt/apt.conf.d/99gpunode-unattended-upgrades"
NEEDRESTART_CONF = "/etc/needrestart/conf.d/90-gpunode.conf"
# Print the packages, apt's periodic settings, the units, needrestart's settings and this library's own
# files (shell/unattended-upgrades.sh).
_READ = shell.script(Path(__file__).parent / "shell" / "unattended-upgrades.sh")


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
        return shell.command(
            _READ, "gpunode-unattended-upgrades", MARK, DPKG_FORMAT, apt_conf, needrestart_conf, *TIMERS, SERVICE
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
