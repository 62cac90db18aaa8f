"""Facts about the node's kernel: running release, kernel packages, holds, boot kernel, Secure Boot, nouveau."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, TypedDict, cast

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.facts._composite import Part, joined_command, split_values
from pyinfra_gpunode.facts.unattended_upgrades import UnattendedUpgradesInfo, UnattendedUpgradesState
from pyinfra_gpunode.sections import DPKG_FORMAT, MARK, parse_dpkg_status, split_sections

SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

_SHELL = Path(__file__).parent / "shell"
# Print how the node booted: BIOS, the Secure Boot variable's value or mokutil's word (shell/secure-boot.sh).
SECURE_BOOT_COMMAND = shell.command(
    shell.script(_SHELL / "secure-boot.sh"), "gpunode-secure-boot", MARK, SECURE_BOOT_VAR
)
# Print the running kernel, the kernel packages, the boot kernel and whether nouveau is loaded
# (shell/kernel-state.sh).
_KERNEL_STATE = shell.command(shell.script(_SHELL / "kernel-state.sh"), "gpunode-kernel-state", MARK, DPKG_FORMAT)
# Print whether nouveau is loaded, the initramfs note and the blacklist file (shell/nouveau-blacklist.sh).
_NOUVEAU_BLACKLIST = shell.script(_SHELL / "nouveau-blacklist.sh")


def parse_secure_boot(lines: list[str]) -> bool | None:
    """``True``/``False`` from the Secure Boot section; None when it cannot be told."""
    text = " ".join(lines).strip()
    if text == "bios" or "doesn't support Secure Boot" in text:
        return False
    if text.startswith("efivar"):
        value = text.split()[1:] or [""]
        return {"1": True, "0": False}.get(value[0])
    lowered = text.lower()
    if "secureboot enabled" in lowered or "secure boot enabled" in lowered:
        return True
    if "secureboot disabled" in lowered or "secure boot disabled" in lowered:
        return False
    return None


def _boot_kernel(lines: list[str]) -> str | None:
    for line in lines:
        target = line.strip().rsplit("/", 1)[-1]
        if target.startswith("vmlinuz-"):
            return target[len("vmlinuz-") :]
    return None


class KernelInfo(TypedDict):
    """``KernelState``'s value."""

    running: str | None
    packages: dict[str, str]
    held: list[str]
    boot_kernel: str | None
    secure_boot: bool | None
    nouveau_loaded: bool


class KernelState(FactBase[KernelInfo]):
    """
    Returns the kernel state in one read: running release, installed ``linux-*`` packages,
    which of them are held (dpkg's selection state, which ``apt-mark hold`` sets), the kernel
    the ``/vmlinuz`` (Debian) or ``/boot/vmlinuz`` (Ubuntu) link boots next, Secure Boot, and
    whether nouveau is loaded.

    .. code:: python

        {
            "running": "6.12.117+deb13-cloud-amd64",
            "packages": {"linux-image-cloud-amd64": "6.12.117-1"},
            "held": ["linux-image-cloud-amd64"],
            "boot_kernel": "6.12.117+deb13-cloud-amd64",
            "secure_boot": False,
            "nouveau_loaded": False,
        }
    """

    @override
    def command(self) -> str:
        return f"{_KERNEL_STATE}; {SECURE_BOOT_COMMAND}"

    @staticmethod
    def default() -> KernelInfo:
        return {
            "running": None,
            "packages": {},
            "held": [],
            "boot_kernel": None,
            "secure_boot": None,
            "nouveau_loaded": False,
        }

    @override
    def process(self, output: list[str]) -> KernelInfo:
        sections = split_sections(output)
        running = [line.strip() for line in sections.get("running", []) if line.strip()]
        packages = parse_dpkg_status(sections.get("packages", []))
        return {
            "running": running[0] if running else None,
            "packages": {name: info["version"] for name, info in sorted(packages.items())},
            "held": sorted(name for name, info in packages.items() if info["held"]),
            "boot_kernel": _boot_kernel(sections.get("boot", [])),
            "secure_boot": parse_secure_boot(sections.get("secureboot", [])),
            "nouveau_loaded": any(line.strip() == "loaded" for line in sections.get("nouveau", [])),
        }


class KernelSecureBoot(FactBase[bool | None]):
    """
    Returns whether Secure Boot is on: ``True``/``False``; ``False`` on a BIOS boot; None
    when neither the EFI variable nor ``mokutil`` can tell.

    .. code:: python

        True
    """

    @override
    def command(self) -> str:
        return SECURE_BOOT_COMMAND

    @staticmethod
    def default() -> None:
        return None

    @override
    def process(self, output: list[str]) -> bool | None:
        return parse_secure_boot(split_sections(output).get("secureboot", []))


INITRAMFS_STAMPS = "/var/lib/pyinfra-gpunode/initramfs"


def initramfs_stamp(path: str) -> str:
    """Where the blacklist text the initramfs was last regenerated with is kept, for the modprobe.d file ``path``."""
    return f"{INITRAMFS_STAMPS}/{path.rsplit('/', 1)[-1]}"


class NouveauBlacklistInfo(TypedDict):
    """``NouveauBlacklist``'s value."""

    content: str | None
    initramfs: str | None
    loaded: bool
    nova_core_shipped: bool  # an installed kernel ships nova_core (Linux 6.15 and later)
    nova_core_loaded: bool


class NouveauBlacklist(FactBase[NouveauBlacklistInfo]):
    """
    Returns the content of a modprobe.d file meant to blacklist nouveau (None when absent),
    the blacklist text the initramfs was last regenerated with (None when it never was, or the
    regeneration failed), whether nouveau is loaded now, and whether an installed kernel ships the
    ``nova_core`` module (Linux 6.15's driver for GSP GPUs, Turing and later) and it is loaded.

    .. code:: python

        {
            "content": "blacklist nouveau\\noptions nouveau modeset=0\\n",
            "initramfs": "blacklist nouveau\\noptions nouveau modeset=0\\n",
            "loaded": False,
            "nova_core_shipped": False,
            "nova_core_loaded": False,
        }
    """

    @override
    def command(self, path: str) -> str:
        return shell.command(_NOUVEAU_BLACKLIST, "gpunode-nouveau-blacklist", MARK, path, initramfs_stamp(path))

    @staticmethod
    def default() -> NouveauBlacklistInfo:
        return {
            "content": None,
            "initramfs": None,
            "loaded": False,
            "nova_core_shipped": False,
            "nova_core_loaded": False,
        }

    @override
    def process(self, output: list[str]) -> NouveauBlacklistInfo:
        sections = split_sections(output)

        def text(name: str) -> str | None:
            return None if name not in sections else "\n".join(sections[name]) + "\n"

        return {
            "content": text("content"),
            "initramfs": text("initramfs"),
            "loaded": any(line.strip() == "loaded" for line in sections.get("nouveau", [])),
            "nova_core_shipped": any(line.strip() == "shipped" for line in sections.get("nova_core", [])),
            "nova_core_loaded": any(line.strip() == "loaded" for line in sections.get("nova_core", [])),
        }


PREP_PART = "@@gpunode-prep:"
NOUVEAU_CONF = "/etc/modprobe.d/gpunode-blacklist-nouveau.conf"  # this library's blacklist file


class HostPrepInfo(TypedDict):
    """``HostPrepState``'s value."""

    kernel: KernelInfo
    unattended: UnattendedUpgradesInfo
    nouveau: NouveauBlacklistInfo


class HostPrepState(FactBase[HostPrepInfo]):
    """
    Returns in one command what the host-preparation steps read: ``KernelState``,
    ``UnattendedUpgradesState`` (this library's default drop-in paths) and ``NouveauBlacklist``
    for ``path``, each as that fact returns it.

    + path: modprobe.d file meant to blacklist nouveau

    .. code:: python

        {
            "kernel": {"running": "6.12.117+deb13-cloud-amd64", "packages": {...}, "held": [...], ...},
            "unattended": {"unattended_upgrades_installed": True, "apt_conf": None, ...},
            "nouveau": {"content": None, "initramfs": None, "loaded": False},
        }
    """

    parts: ClassVar[dict[str, Part]] = {
        "kernel": Part(KernelState),
        "unattended": Part(UnattendedUpgradesState),  # this library's default drop-in paths
        "nouveau": Part(NouveauBlacklist, lambda arguments: {"path": arguments["path"]}),
    }

    @override
    def command(self, path: str) -> str:
        return joined_command(PREP_PART, self.parts, {"path": path})

    @override
    def process(self, output: list[str]) -> HostPrepInfo:
        return cast(HostPrepInfo, split_values(PREP_PART, self.parts, output))
