"""Facts about the NVIDIA driver: the loaded module and its userspace, and everything the driver
operations decide on, in one read."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.driver_versions import parse_proc_version, version_from_library
from pyinfra_gpunode.facts._composite import Part
from pyinfra_gpunode.facts.fabric_manager import (
    FABRIC_MANAGER_COMMAND,
    FabricManagerInfo,
    NvidiaFabricManager,
    parse_fabric_manager,
)
from pyinfra_gpunode.facts.gpus import PCI_COMMAND, NvidiaGpus, PciInfo, parse_pci
from pyinfra_gpunode.facts.kernel import SECURE_BOOT_COMMAND, parse_secure_boot
from pyinfra_gpunode.gpu_queries import SMI_SECONDS
from pyinfra_gpunode.sections import MARK, PackageStatus, dpkg_query, marker, parse_dpkg_status, split_sections

MODINFO_MAX = 200  # characters kept of a module's vermagic or signer line


class PersistencedUnit(TypedDict):
    """``nvidia-persistenced.service`` as systemd knows it: ``load`` (``loaded``, ``not-found``, ``masked``),
    ``active`` (``active``, ``inactive``, ``failed``, ...) and ``enabled`` (``enabled``, ``disabled``, ...)."""

    load: str | None
    active: str | None
    enabled: str | None


class DriverInfo(TypedDict):
    """``NvidiaDriver``'s value (also ``NvidiaHostState``'s ``driver``)."""

    loaded: bool
    kernel_module_version: str | None
    module_flavor: str | None
    userspace_version: str | None
    mismatch: bool
    nvidia_smi_ok: bool
    nvidia_smi_hung: bool  # nvidia-smi did not answer within SMI_SECONDS (a wedged GPU or driver)
    library: str | None
    library_package: str | None
    persistenced: PersistencedUnit | None  # nvidia-persistenced.service (None: no systemctl to ask)


class NvidiaHostStateInfo(TypedDict):
    """``NvidiaHostState``'s value."""

    distro: str | None
    release: str | None
    arch: str | None
    kernel: str | None
    secure_boot: bool | None
    pci: PciInfo
    driver: DriverInfo
    fabric_manager: FabricManagerInfo
    packages: dict[str, PackageStatus]
    module_built: bool
    built_module_version: str | None
    boot_kernel: str | None  # the kernel the node boots next (its /vmlinuz link), None where none is named
    boot_module_built: bool  # an NVIDIA module file exists for it
    boot_module_version: str | None  # modinfo's version of its nvidia module
    # modinfo's vermagic (the kernel release the module was built for, then its options) and signer
    # ("name (key id)", None where unsigned) of the running kernel's and the next boot kernel's nvidia module
    built_module_vermagic: str | None
    built_module_signer: str | None
    boot_module_vermagic: str | None
    boot_module_signer: str | None


_SHELL = Path(__file__).parent / "shell"
# Print the loaded module's version, the userspace library, its package and nvidia-smi's status
# (shell/nvidia-driver.sh).
DRIVER_COMMAND = shell.command(
    shell.script(_SHELL / "nvidia-driver.sh"), "gpunode-nvidia-driver", MARK, str(SMI_SECONDS)
)
# Print the NVIDIA module built for the running kernel and its version (shell/built-module.sh).
_BUILT_MODULE = shell.command(shell.script(_SHELL / "built-module.sh"), "gpunode-built-module", MARK)


# The driver's packages, whatever the distribution names them: nvidia-driver, libnvidia-ml1, libcuda1,
# firmware-nvidia-gsp, Ubuntu's linux-modules-nvidia-*, and those with the name inside (libglx-nvidia0,
# xserver-xorg-video-nvidia: held with the rest); the kernel headers DKMS builds with.
DRIVER_PACKAGE_PATTERNS = ("*nvidia*", "libcuda*", "linux-headers-*")


def parse_driver(sections: dict[str, list[str]]) -> DriverInfo:
    module = next((line.strip() for line in sections.get("module", []) if line.strip()), None)
    proc = parse_proc_version("\n".join(sections.get("proc", [])))
    paths = [line.strip() for line in sections.get("library", []) if line.strip()]
    userspace = next((version for version in map(version_from_library, paths) if version), None)
    owners = [line.split(": ", 1)[0] for line in sections.get("library_package", []) if ": " in line]
    smi = [line.strip() for line in sections.get("smi", []) if line.startswith("rc=")]
    kernel_version = module or (proc[0] if proc else None)
    return {
        "loaded": module is not None or proc is not None,
        "kernel_module_version": kernel_version,
        "module_flavor": proc[1] if proc else None,
        "userspace_version": userspace,
        "mismatch": bool(kernel_version and userspace and kernel_version != userspace),
        "nvidia_smi_ok": smi == ["rc=0"],
        "nvidia_smi_hung": smi == ["rc=timeout"],
        "library": paths[0] if paths else None,
        "library_package": owners[0].split(":", 1)[0] if owners else None,
        "persistenced": _unit(sections["persistenced"]) if "persistenced" in sections else None,
    }


def _unit(lines: list[str]) -> PersistencedUnit | None:
    """The unit's states from ``key=value`` lines (None where none was printed: no systemctl)."""
    found = dict(line.strip().partition("=")[::2] for line in lines if "=" in line)
    if not found:
        return None
    return {key: found.get(key) or None for key in ("load", "active", "enabled")}  # type: ignore[return-value]


def _no_driver() -> DriverInfo:
    return parse_driver({})


class NvidiaDriver(FactBase[DriverInfo]):
    """
    Returns the NVIDIA driver state without NVML: the loaded kernel module's version
    (``/sys/module/nvidia/version``, else ``/proc/driver/nvidia/version``, either layout), its
    flavour, the userspace version (the ``libnvidia-ml.so.1`` the loader resolves), whether
    the two differ, whether ``nvidia-smi`` works (asked only while the module is loaded, since it
    may load it), and that library's resolved path and the
    package owning it (None for a driver installed outside the package manager).

    .. code:: python

        {
            "loaded": True,
            "kernel_module_version": "580.95.05",
            "module_flavor": "open",
            "userspace_version": "580.95.05",
            "mismatch": False,
            "nvidia_smi_ok": True,
            "nvidia_smi_hung": False,
            "library": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
            "library_package": "libnvidia-compute-580-server",
            "persistenced": {"load": "loaded", "active": "active", "enabled": "enabled"},
        }
    """

    @override
    def command(self) -> str:
        return DRIVER_COMMAND

    @staticmethod
    def default() -> DriverInfo:
        return _no_driver()

    @override
    def process(self, output: list[str]) -> DriverInfo:
        return parse_driver(split_sections(output))


class NvidiaHostState(FactBase[NvidiaHostStateInfo]):
    """
    Returns everything the driver and Fabric Manager operations decide on, in one read:
    distribution (``os-release`` ID and VERSION_ID), architecture, running kernel, Secure
    Boot, the PCI devices (as ``NvidiaGpus``), the driver (as ``NvidiaDriver``), Fabric
    Manager (as ``NvidiaFabricManager``), the installed driver-related packages, whether
    an NVIDIA module file exists for the running kernel (``module_built``), and the version of
    the ``nvidia`` module ``modinfo`` finds for the running kernel (``built_module_version``;
    Debian's renamed ``nvidia-current`` too), None without one; the same for the kernel the
    node boots next (``boot_kernel``, from the ``/vmlinuz`` or ``/boot/vmlinuz`` link:
    ``boot_module_built``, ``boot_module_version``); each module's ``vermagic`` and signer
    (``built_module_*``, ``boot_module_*``; the signer None where the module is unsigned).

    .. code:: python

        {
            "distro": "debian", "release": "13", "arch": "amd64",
            "kernel": "6.12.117+deb13-amd64", "secure_boot": False,
            "pci": {"gpus": [], "nvswitches": [], "nvswitch": False},
            "driver": {"loaded": False, "kernel_module_version": None, "module_flavor": None,
                       "userspace_version": None, "mismatch": False, "nvidia_smi_ok": False,
                       "nvidia_smi_hung": False, "library": None, "library_package": None},
            "fabric_manager": {"packages": {}, "held": [], "version": None,
                               "active": None, "enabled": None},
            "packages": {"nvidia-driver": {"version": "550.163.01-2", "held": True}},
            "module_built": True,
            "built_module_version": "550.163.01",
            "boot_kernel": "6.12.117+deb13-amd64", "boot_module_built": True, "boot_module_version": "550.163.01",
            "built_module_vermagic": "6.12.117+deb13-amd64 SMP preempt mod_unload modversions",
            "built_module_signer": "DKMS module signing key (2B:61:…:9E)",
            "boot_module_vermagic": "6.12.117+deb13-amd64 SMP preempt mod_unload modversions",
            "boot_module_signer": "DKMS module signing key (2B:61:…:9E)",
        }
    """

    # Its command and value are its own (the parts share its sections); where its value holds them:
    parts: ClassVar[dict[str, Part]] = {
        "pci": Part(NvidiaGpus),
        "driver": Part(NvidiaDriver),
        "fabric_manager": Part(NvidiaFabricManager),
    }

    @override
    def command(self) -> str:
        return "; ".join(
            [
                marker("os"),
                'if [ -r /etc/os-release ]; then . /etc/os-release; echo "$ID"; echo "$VERSION_ID"; fi',
                marker("arch"),
                "dpkg --print-architecture 2>/dev/null || uname -m",
                marker("kernel"),
                "uname -r",
                SECURE_BOOT_COMMAND,
                PCI_COMMAND,
                DRIVER_COMMAND,
                FABRIC_MANAGER_COMMAND,
                marker("packages"),
                dpkg_query(*DRIVER_PACKAGE_PATTERNS),
                _BUILT_MODULE,
            ]
        )

    @override
    def process(self, output: list[str]) -> NvidiaHostStateInfo:
        sections = split_sections(output)
        os_lines = [line.strip() for line in sections.get("os", [])] + ["", ""]
        arch = [line.strip() for line in sections.get("arch", []) if line.strip()]
        kernel = [line.strip() for line in sections.get("kernel", []) if line.strip()]
        return {
            "distro": os_lines[0] or None,
            "release": os_lines[1] or None,
            "arch": arch[0] if arch else None,
            "kernel": kernel[0] if kernel else None,
            "secure_boot": parse_secure_boot(sections.get("secureboot", [])),
            "pci": parse_pci(sections),
            "driver": parse_driver(sections),
            "fabric_manager": parse_fabric_manager(sections),
            "packages": dict(sorted(parse_dpkg_status(sections.get("packages", [])).items())),
            "module_built": any(line.strip() for line in sections.get("kmod", [])),
            "built_module_version": _first(sections.get("kmod_version", [])),
            "boot_kernel": _first(sections.get("boot_release", [])),
            "boot_module_built": any(line.strip() for line in sections.get("boot_kmod", [])),
            "boot_module_version": _first(sections.get("boot_kmod_version", [])),
            "built_module_vermagic": _first(sections.get("kmod_vermagic", []), MODINFO_MAX),
            "built_module_signer": _first(sections.get("kmod_signer", []), MODINFO_MAX),
            "boot_module_vermagic": _first(sections.get("boot_kmod_vermagic", []), MODINFO_MAX),
            "boot_module_signer": _first(sections.get("boot_kmod_signer", []), MODINFO_MAX),
        }


def _first(lines: list[str], most: int | None = None) -> str | None:
    """The first line that is not blank, stripped (its first ``most`` characters), or None."""
    found = next((line.strip() for line in lines if line.strip()), None)
    return found if found is None or most is None else found[:most]
