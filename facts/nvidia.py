"""Facts about NVIDIA GPUs, the driver, NVML, Fabric Manager and the container toolkit on a node."""

from __future__ import annotations

import json
import re
import shlex
from typing import ClassVar, TypedDict, cast

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from pyinfra.facts.server import LinuxDistribution, LinuxDistributionDict
from typing_extensions import override

from pyinfra_gpunode.driver_versions import parse_proc_version, version_from_library
from pyinfra_gpunode.facts._composite import Part, joined_command, split_values
from pyinfra_gpunode.sections import PackageStatus, dpkg_query, marker, parse_dpkg_status, split_sections


class DriverInfo(TypedDict):
    """``NvidiaDriver``'s value (also ``NvidiaHostState``'s ``driver``)."""

    loaded: bool
    kernel_module_version: str | None
    module_flavor: str | None
    userspace_version: str | None
    mismatch: bool
    nvidia_smi_ok: bool
    library: str | None
    library_package: str | None


# One NVIDIA PCI device ("class" is a keyword, hence the functional form).
PciDevice = TypedDict("PciDevice", {"address": str, "class": str, "device": str})


class PciInfo(TypedDict):
    """``NvidiaGpus``'s value (also ``NvidiaHostState``'s ``pci``)."""

    gpus: list[PciDevice]
    nvswitches: list[PciDevice]
    nvswitch: bool


class FabricManagerInfo(TypedDict):
    """``NvidiaFabricManager``'s value (also ``NvidiaHostState``'s ``fabric_manager``)."""

    packages: dict[str, str]
    held: list[str]
    version: str | None
    active: str | None
    enabled: str | None


class NodeKindInfo(TypedDict):
    """``NodeKind``'s value."""

    distribution: LinuxDistributionDict
    gpus: PciInfo


class NvmlDevice(TypedDict):
    index: int
    name: str
    uuid: str
    memory_total: int


class NvmlInfoDict(TypedDict):
    """``NvmlInfo``'s value (None without pynvml on the node)."""

    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: str | None
    devices: list[NvmlDevice]
    error: str | None


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


class ToolkitInfo(TypedDict):
    """``NvidiaContainerToolkit``'s value."""

    ctk_version: str | None
    ctk_path: str | None
    packages: dict[str, str]
    held: list[str]
    runtime_binary: str | None
    keyring_fingerprints: list[str]
    repo_list: str | None


# ---- shell parts, shared by the facts below and the combined NvidiaHostState --------------

DRIVER_SCRIPT = "; ".join(
    [
        "PATH=$PATH:/sbin:/usr/sbin",
        marker("module"),
        "if [ -r /sys/module/nvidia/version ]; then cat /sys/module/nvidia/version; fi",
        marker("proc"),
        "if [ -r /proc/driver/nvidia/version ]; then cat /proc/driver/nvidia/version; fi",
        marker("library"),
        "nvml=$(ldconfig -p 2>/dev/null | awk '$1 == \"libnvidia-ml.so.1\" && /x86-64|AArch64/ {print $NF}' "
        '| while read -r lib; do readlink -f "$lib"; done)',
        'if [ -n "$nvml" ]; then echo "$nvml"; fi',
        # The package owning the library the loader picks first (dpkg may know it without /usr).
        marker("library_package"),
        'first=$(echo "$nvml" | head -n 1)',
        'if [ -n "$first" ] && command -v dpkg-query >/dev/null 2>&1; then '
        'dpkg-query -S "$first" "${first#/usr}" 2>/dev/null | head -n 1; fi',
        # Only with the module loaded: nvidia-smi (through nvidia-modprobe) would load it otherwise.
        marker("smi"),
        "if [ -d /sys/module/nvidia ] && command -v nvidia-smi >/dev/null 2>&1; then "
        "nvidia-smi --query-gpu=driver_version --format=csv,noheader >/dev/null 2>&1; echo rc=$?; fi",
    ]
)

PCI_SCRIPT = "; ".join(
    [
        marker("pci"),
        "for dev in /sys/bus/pci/devices/*; do v=; "  # read, not cat: one process less per device
        'if [ -r "$dev/vendor" ] && read -r v < "$dev/vendor" && [ "$v" = 0x10de ]; then '
        'echo "${dev##*/} $(cat "$dev/class") $(cat "$dev/device")"; fi; done',
        marker("nvswitch"),
        "if [ -d /proc/driver/nvidia-nvswitch/devices ]; then ls /proc/driver/nvidia-nvswitch/devices; fi",
    ]
)

FABRIC_MANAGER_SCRIPT = "; ".join(
    [
        marker("fm_packages"),
        dpkg_query("nvidia-fabricmanager*", "libnvidia-nscq*"),
        marker("fm_unit"),
        "if command -v systemctl >/dev/null 2>&1; then "
        "echo active=$(systemctl is-active nvidia-fabricmanager.service 2>/dev/null); "
        "echo enabled=$(systemctl is-enabled nvidia-fabricmanager.service 2>/dev/null); fi",
    ]
)

DRIVER_PACKAGE_PATTERNS = (
    "nvidia-*",
    "libnvidia-*",
    "linux-modules-nvidia-*",
    "linux-objects-nvidia-*",
    "linux-signatures-nvidia-*",
    "linux-headers-*",
    "firmware-nvidia-*",
)


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
        "library": paths[0] if paths else None,
        "library_package": owners[0].split(":", 1)[0] if owners else None,
    }


def parse_pci(sections: dict[str, list[str]]) -> PciInfo:
    gpus: list[PciDevice] = []
    switches: list[PciDevice] = []
    for line in sections.get("pci", []):
        parts = line.split()
        if len(parts) != 3:
            continue
        address, pci_class, device = parts
        entry: PciDevice = {"address": address, "class": pci_class, "device": device}
        if pci_class.startswith(("0x0300", "0x0302")):
            gpus.append(entry)
        elif pci_class.startswith("0x0680"):
            switches.append(entry)
    nvswitch_devices = [line.strip() for line in sections.get("nvswitch", []) if line.strip()]
    return {"gpus": gpus, "nvswitches": switches, "nvswitch": bool(switches or nvswitch_devices)}


def parse_fabric_manager(sections: dict[str, list[str]]) -> FabricManagerInfo:
    packages = parse_dpkg_status(sections.get("fm_packages", []))
    unit = dict(line.partition("=")[::2] for line in sections.get("fm_unit", []) if "=" in line)
    versions = [info["version"] for name, info in packages.items() if name.startswith("nvidia-fabricmanager")]
    return {
        "packages": {name: info["version"] for name, info in sorted(packages.items())},
        "held": sorted(name for name, info in packages.items() if info["held"]),
        "version": str(versions[0]) if versions else None,
        "active": unit.get("active") or None,
        "enabled": unit.get("enabled") or None,
    }


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
            "library": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
            "library_package": "libnvidia-compute-580-server",
        }
    """

    @override
    def command(self) -> str:
        return DRIVER_SCRIPT

    @staticmethod
    def default() -> DriverInfo:
        return _no_driver()

    @override
    def process(self, output: list[str]) -> DriverInfo:
        return parse_driver(split_sections(output))


class NvidiaGpus(FactBase[PciInfo]):
    """
    Returns the NVIDIA PCI devices (vendor ``0x10de``; no driver needed): GPUs (class
    ``0x0300``/``0x0302``), NVSwitch bridges (class ``0x0680``), and whether this is an
    NVSwitch system (such bridges, or a non-empty ``/proc/driver/nvidia-nvswitch/devices``).

    .. code:: python

        {
            "gpus": [{"address": "0000:07:00.0", "class": "0x030200", "device": "0x20b0"}],
            "nvswitches": [],
            "nvswitch": False,
        }
    """

    @override
    def command(self) -> str:
        return PCI_SCRIPT

    @staticmethod
    def default() -> PciInfo:
        return parse_pci({})

    @override
    def process(self, output: list[str]) -> PciInfo:
        return parse_pci(split_sections(output))


KIND_PART = "@@gpunode-kind:"


class NodeKind(FactBase[NodeKindInfo]):
    """
    Returns in one command what decides which steps a node gets: pyinfra's ``LinuxDistribution``
    and ``NvidiaGpus``, each as that fact returns it.

    .. code:: python

        {
            "distribution": {"name": "Debian", "major": 13, "minor": None, "release_meta": {"ID": "debian", ...}},
            "gpus": {"gpus": [{"address": "0000:07:00.0", "class": "0x030200", "device": "0x20b0"}],
                     "nvswitches": [], "nvswitch": False},
        }
    """

    parts: ClassVar[dict[str, Part]] = {
        "distribution": Part(LinuxDistribution, script=lambda arguments: f"({LinuxDistribution().command()})"),
        "gpus": Part(NvidiaGpus),
    }

    @override
    def command(self) -> str:
        return joined_command(KIND_PART, self.parts, {})

    @override
    def process(self, output: list[str]) -> NodeKindInfo:
        return cast(NodeKindInfo, split_values(KIND_PART, self.parts, output))


NVML_SNIPPET = """
import json
import os
try:
    import pynvml
except Exception:
    raise SystemExit(0)
def text(value):
    return value.decode() if isinstance(value, bytes) else value
out = {"driver_version": None, "nvml_version": None, "cuda_driver_version": None, "devices": [], "error": None}
if not os.path.isdir("/sys/module/nvidia"):  # nvmlInit would load the module (nvidia-modprobe)
    out["error"] = "DriverNotLoaded"
    print(json.dumps(out))
    raise SystemExit(0)
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    out["error"] = type(exc).__name__.replace("NVMLError_", "")
try:
    out["nvml_version"] = text(pynvml.nvmlSystemGetNVMLVersion())
except Exception:
    pass
if out["error"]:
    print(json.dumps(out))
    raise SystemExit(0)
try:
    out["driver_version"] = text(pynvml.nvmlSystemGetDriverVersion())
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
    out["cuda_driver_version"] = "%d.%d" % (cuda // 1000, cuda % 1000 // 10)
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        out["devices"].append({"index": index, "name": text(pynvml.nvmlDeviceGetName(handle)),
                               "uuid": text(pynvml.nvmlDeviceGetUUID(handle)), "memory_total": memory.total})
except pynvml.NVMLError as exc:
    out["error"] = type(exc).__name__.replace("NVMLError_", "")
finally:
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass
print(json.dumps(out))
"""


class NvmlInfo(FactBase[NvmlInfoDict | None]):
    """
    Returns what NVML reports through pynvml (``nvidia-ml-py``) when ``python3`` on the node
    can import it: driver, NVML and CUDA driver versions and the devices, or the NVML error
    name (e.g. ``LibRmVersionMismatch``, ``DriverNotLoaded``). NVML is asked only while the
    nvidia module is loaded (``/sys/module/nvidia``), since initialising it may load the module:
    otherwise the error is ``DriverNotLoaded``. None without pynvml, and on a node without an
    NVIDIA PCI device (not asked).

    .. code:: python

        {
            "driver_version": "550.163.01",
            "nvml_version": "12.550.163.01",
            "cuda_driver_version": "12.4",
            "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                         "uuid": "GPU-bc5610b9-...", "memory_total": 85520809984}],
            "error": None,
        }
    """

    @override
    def command(self) -> str:
        return (
            "if grep -qsx 0x10de /sys/bus/pci/devices/*/vendor && command -v python3 >/dev/null 2>&1; then "
            f"python3 -B -c {shlex.quote(NVML_SNIPPET)}; fi"
        )

    @staticmethod
    def default() -> None:
        return None

    @override
    def process(self, output: list[str]) -> NvmlInfoDict | None:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            value = json.loads(text.splitlines()[-1])
        except json.JSONDecodeError as exc:
            raise FactProcessError(f"NVML query printed no JSON: {exc}") from exc
        return cast(NvmlInfoDict, value) if isinstance(value, dict) else None


class NvidiaFabricManager(FactBase[FabricManagerInfo]):
    """
    Returns the Fabric Manager packages installed (``nvidia-fabricmanager*``, ``libnvidia-nscq*``)
    with their versions and holds, and the state of ``nvidia-fabricmanager.service``.

    .. code:: python

        {
            "packages": {"nvidia-fabricmanager-580": "580.126.20-0ubuntu0.24.04.1"},
            "held": ["nvidia-fabricmanager-580"],
            "version": "580.126.20-0ubuntu0.24.04.1",
            "active": "active",
            "enabled": "enabled",
        }
    """

    @override
    def command(self) -> str:
        return FABRIC_MANAGER_SCRIPT

    @staticmethod
    def default() -> FabricManagerInfo:
        return parse_fabric_manager({})

    @override
    def process(self, output: list[str]) -> FabricManagerInfo:
        return parse_fabric_manager(split_sections(output))


class NvidiaHostState(FactBase[NvidiaHostStateInfo]):
    """
    Returns everything the driver and Fabric Manager operations decide on, in one read:
    distribution (``os-release`` ID and VERSION_ID), architecture, running kernel, Secure
    Boot, the PCI devices (as ``NvidiaGpus``), the driver (as ``NvidiaDriver``), Fabric
    Manager (as ``NvidiaFabricManager``), the installed driver-related packages, whether
    an NVIDIA module file exists for the running kernel (``module_built``), and the version of
    the ``nvidia`` module ``modinfo`` finds for the running kernel (``built_module_version``;
    Debian's renamed ``nvidia-current`` too), None without one.

    .. code:: python

        {
            "distro": "debian", "release": "13", "arch": "amd64",
            "kernel": "6.12.117+deb13-amd64", "secure_boot": False,
            "pci": {"gpus": [], "nvswitches": [], "nvswitch": False},
            "driver": {"loaded": False, "kernel_module_version": None, "module_flavor": None,
                       "userspace_version": None, "mismatch": False, "nvidia_smi_ok": False,
                       "library": None, "library_package": None},
            "fabric_manager": {"packages": {}, "held": [], "version": None,
                               "active": None, "enabled": None},
            "packages": {"nvidia-driver": {"version": "550.163.01-2", "held": True}},
            "module_built": True,
            "built_module_version": "550.163.01",
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
        from pyinfra_gpunode.facts.kernel import SECURE_BOOT_SCRIPT

        return "; ".join(
            [
                marker("os"),
                'if [ -r /etc/os-release ]; then . /etc/os-release; echo "$ID"; echo "$VERSION_ID"; fi',
                marker("arch"),
                "dpkg --print-architecture 2>/dev/null || uname -m",
                marker("kernel"),
                "uname -r",
                SECURE_BOOT_SCRIPT,
                PCI_SCRIPT,
                DRIVER_SCRIPT,
                FABRIC_MANAGER_SCRIPT,
                marker("packages"),
                dpkg_query(*DRIVER_PACKAGE_PATTERNS),
                marker("kmod"),
                "find /lib/modules/\"$(uname -r)\" -name 'nvidia*.ko*' 2>/dev/null | head -n 1",
                marker("kmod_version"),
                'modinfo -k "$(uname -r)" -F version nvidia 2>/dev/null '
                '|| modinfo -k "$(uname -r)" -F version nvidia-current 2>/dev/null || true',
            ]
        )

    @override
    def process(self, output: list[str]) -> NvidiaHostStateInfo:
        from pyinfra_gpunode.facts.kernel import parse_secure_boot

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
            "built_module_version": next(
                (line.strip() for line in sections.get("kmod_version", []) if line.strip()), None
            ),
        }


# apt options that keep apt-cache from writing its binary caches (pkgcache.bin, srcpkgcache.bin).
APT_READ_ONLY = "-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache="


class NvidiaAptVersions(FactBase[dict[str, list[str]]]):
    """
    Returns the versions the package index offers for each package, newest first
    (``apt-cache madison``); packages the index does not know are absent. apt's binary caches
    are built in memory only, so reading writes nothing under ``/var/cache/apt``.

    .. code:: python

        {"nvidia-driver": ["550.163.01-2"], "nvidia-kernel-dkms": ["550.163.01-2"]}
    """

    @override
    def command(self, packages: list[str]) -> str:
        names = " ".join(shlex.quote(name) for name in packages)
        return f"apt-cache {APT_READ_ONLY} madison {names} 2>/dev/null || true"

    @staticmethod
    def default() -> dict[str, list[str]]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[str, list[str]]:
        versions: dict[str, list[str]] = {}
        for line in output:
            parts = [part.strip() for part in line.split("|")]
            if len(parts) < 3 or not parts[0] or not parts[1]:
                continue
            if not parts[2].endswith(("Packages", "Sources")) or parts[2].endswith("Sources"):
                continue
            found = versions.setdefault(parts[0], [])
            if parts[1] not in found:
                found.append(parts[1])
        return versions


class AptFile(TypedDict):
    name: str  # the .deb file's name in /var/cache/apt/archives ("": apt's line did not read as one)
    size: int  # bytes


class AptDownloadsInfo(TypedDict):
    """``AptDownloads``'s value."""

    files: list[AptFile]
    error: str | None


_DEB_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+~%_:-]*\.deb\Z")
APT_DOWNLOADS_MAX = 2000  # files an answer may list; more is no node's driver or toolkit
APT_ERROR_MAX = 500  # characters of apt's error kept


class AptDownloads(FactBase[AptDownloadsInfo]):
    """
    Returns the ``.deb`` files apt would fetch to install ``packages`` (``name=version`` or ``name``),
    with what they depend on, and apt's first error (a version the index does not offer, a conflict),
    or None (``apt-get install --print-uris``). Files already in ``/var/cache/apt/archives`` are not
    listed, so an empty list means the install needs no download. Nothing is installed, downloaded
    or locked, and apt's binary caches are built in memory only.

    .. code:: python

        {"files": [{"name": "nvidia-driver_550.163.01-2_amd64.deb", "size": 493100}], "error": None}
    """

    @override
    def command(self, packages: list[str]) -> str:
        pins = " ".join(shlex.quote(pin) for pin in packages)
        return (
            f"apt-get {APT_READ_ONLY} --print-uris -qq -y --no-install-recommends --allow-change-held-packages "
            f'install {pins} 2>&1; echo "rc=$?"'
        )

    @staticmethod
    def default() -> AptDownloadsInfo:
        return {"files": [], "error": None}

    @override
    def process(self, output: list[str]) -> AptDownloadsInfo:
        files: list[AptFile] = []
        errors: list[str] = []
        status = None
        for line in output:
            if line.startswith("'"):  # 'URI' FILE SIZE HASH
                parts = line.split()
                if len(parts) >= 3 and _DEB_FILE.match(parts[1]) and parts[2].isdigit():
                    files.append({"name": parts[1], "size": int(parts[2])})
                else:  # a file all the same: the install is not ready without a download
                    files.append({"name": "", "size": 0})
                if len(files) > APT_DOWNLOADS_MAX:
                    raise FactProcessError(f"apt would fetch more than {APT_DOWNLOADS_MAX} files")
            elif line.startswith("E: "):
                errors.append(line[3:].strip()[:APT_ERROR_MAX])
            elif line.startswith("rc="):
                status = line[3:].strip()
        error = errors[0] if errors else None
        if error is None and status not in (None, "0"):
            error = f"apt-get exited {status[:10]}"
        return {"files": files, "error": error}


TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"


def primary_fingerprints(path: str) -> str:
    """Shell printing the primary keys' fingerprints in the key file ``path`` (a shell word), one a line.

    Subkeys are not listed. gpg runs in a throwaway home, so the node's own ``~/.gnupg`` is not created.
    """
    return (
        f'gpghome=$(mktemp -d) && {{ gpg --homedir "$gpghome" --batch --show-keys --with-colons {path} 2>/dev/null '
        '| awk -F: \'$1 == "pub" {want = 1} $1 == "sub" {want = 0} $1 == "fpr" && want {print $10; want = 0}\'; '
        'rm -rf "$gpghome"; }'
    )


class NvidiaContainerToolkit(FactBase[ToolkitInfo]):
    """
    Returns the NVIDIA Container Toolkit state: ``nvidia-ctk --version`` and where
    ``nvidia-ctk`` is, its four packages with versions and holds, where
    ``nvidia-container-runtime`` is, the primary-key fingerprints of the repository keyring
    (needs ``gpg``; subkeys not listed) and the repository list file's content.

    .. code:: python

        {
            "ctk_version": "1.17.0",
            "ctk_path": "/usr/bin/nvidia-ctk",
            "packages": {"nvidia-container-toolkit": "1.17.0-1"},
            "held": ["nvidia-container-toolkit"],
            "runtime_binary": "/usr/bin/nvidia-container-runtime",
            "keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"],
            "repo_list": None,
        }
    """

    @override
    def command(self) -> str:
        return "; ".join(
            [
                marker("ctk"),
                "if command -v nvidia-ctk >/dev/null 2>&1; then nvidia-ctk --version 2>/dev/null | head -n 1; fi",
                marker("ctk_path"),
                "command -v nvidia-ctk || true",
                marker("packages"),
                dpkg_query(*TOOLKIT_PACKAGES),
                marker("runtime"),
                "command -v nvidia-container-runtime || true",
                marker("keyring"),
                f"if [ -f {TOOLKIT_KEYRING} ] && command -v gpg >/dev/null 2>&1; then "
                f"{primary_fingerprints(TOOLKIT_KEYRING)}; fi",
                f"if [ -f {TOOLKIT_LIST} ]; then {marker('list')}; cat {TOOLKIT_LIST}; fi",
            ]
        )

    @staticmethod
    def default() -> ToolkitInfo:
        return NvidiaContainerToolkit().process([])

    @override
    def process(self, output: list[str]) -> ToolkitInfo:
        sections = split_sections(output)
        ctk = [line.split()[-1] for line in sections.get("ctk", []) if "version" in line and line.split()]
        packages = parse_dpkg_status(sections.get("packages", []))
        runtime = [line.strip() for line in sections.get("runtime", []) if line.strip().startswith("/")]
        ctk_path = [line.strip() for line in sections.get("ctk_path", []) if line.strip().startswith("/")]
        listing = sections.get("list")
        return {
            "ctk_version": ctk[0] if ctk else None,
            "ctk_path": ctk_path[0] if ctk_path else None,
            "packages": {name: info["version"] for name, info in sorted(packages.items())},
            "held": sorted(name for name, info in packages.items() if info["held"]),
            "runtime_binary": runtime[0] if runtime else None,
            "keyring_fingerprints": [line.strip() for line in sections.get("keyring", []) if line.strip()],
            "repo_list": None if listing is None else "\n".join(listing) + "\n",
        }
