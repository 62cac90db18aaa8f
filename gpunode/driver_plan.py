"""Which NVIDIA driver packages to install and hold, per distribution and branch (no I/O).

Two steps, so that a converged host needs no package-index query:

1. :func:`wanted_names` lists the package names the plan may use (for ``apt-cache madison``).
2. :func:`plan_driver` picks the packages and their exact versions from what is installed
   and what the package index offers, or returns a reason the host cannot get the driver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .driver_versions import branch_of, is_branch, is_driver_version, same_driver, upstream_version, version_key
from .settings import DRIVER_FLAVOR, DriverSettings

# Ubuntu (Canonical's restricted archive), per release: branches with real packages, and branches whose
# packages became transitional dummies that pull in a newer branch. 26.04 (resolute, kernel 7.0): its
# nvidia-graphics-drivers-580-server (580.173.02-0ubuntu0.26.04.1) builds the 535-server and 570-server
# packages as transitional ones (packages.ubuntu.com/source/resolute/nvidia-graphics-drivers-580-server), and
# linux-restricted-modules ships branch 595's precompiled modules, proprietary and open, for its 7.0 kernels
# (packages.ubuntu.com/resolute/linux-modules-nvidia-595-nvidia, .../linux-modules-nvidia-595-open-nvidia).
UBUNTU_BRANCHES = {"22.04": ("535", "580", "595"), "24.04": ("535", "580", "595"), "26.04": ("580", "595")}
UBUNTU_TRANSITIONAL = {
    "22.04": {"550": "570", "570": "580"},
    "24.04": {"550": "570", "570": "580"},
    "26.04": {"535": "580", "570": "580"},
}
UBUNTU_RELEASES = tuple(UBUNTU_BRANCHES)

# Debian non-free: the branch each package family carries per release.
DEBIAN_FAMILIES: dict[str, dict[str, str]] = {
    "12": {"535": "current"},
    "13": {"550": "current", "535": "tesla-535"},
}

# Debian packages of the driver tree at versions of their own (the installed one, else the index's newest):
# nvidia-persistenced (contrib; trixie's 550.163.01-1 serves the 550 and Tesla 535 trees; each driver only
# recommends it, so an install without recommendations lacks it and persistence mode cannot be turned on).
DEBIAN_COMPANIONS = ("nvidia-persistenced",)

FLAVORS = ("default", "server", "open", "server-open")
# Where the driver comes from: packages this project installs, or a driver already on the node.
DRIVER_SOURCES = ("auto", "packages", "preinstalled")
NO_DRIVER = (
    "no NVIDIA driver is loaded and none is asked for: set gpunode_driver_branch (e.g. 580) or "
    "gpunode_driver_version to install one from packages, or load a driver on the node first and keep "
    "gpunode_driver_source at auto (or set it to preinstalled)"
)


class DriverRequestError(ValueError):
    """The requested driver is invalid whatever the host; the message names the argument."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument  # ``branch``, ``version`` or ``flavor``


@dataclass(frozen=True)
class DriverRequest:
    branch: str | None = None
    version: str | None = None
    flavor: str = DRIVER_FLAVOR
    allow_dkms: bool = False
    mok_enrolled: bool = False

    @property
    def open(self) -> bool:
        return self.flavor in ("open", "server-open")

    @property
    def server(self) -> bool:
        return self.flavor in ("server", "server-open")


@dataclass(frozen=True)
class HostInfo:
    distro: str  # os-release ID
    release: str  # os-release VERSION_ID
    kernel: str  # the kernel the module must load on
    arch: str = "amd64"
    secure_boot: bool | None = False  # None: the node could not tell
    boot_kernel: str = ""  # the kernel the node boots next where it is another one ("": the same, or unknown)

    @property
    def kernels(self) -> list[str]:
        """The kernels a DKMS module is built for: the running one, and the one booted next."""
        return [self.kernel, *([self.boot_kernel] if self.boot_kernel and self.boot_kernel != self.kernel else [])]

    @property
    def next_kernel(self) -> str:
        """The kernel the node boots next (the running one where the node does not say another)."""
        return self.boot_kernel or self.kernel


@dataclass
class DriverPlan:
    version: str = ""  # the driver version the plan installs
    method: str = ""  # "precompiled" or "dkms"
    packages: dict[str, str] = field(default_factory=dict)  # name -> exact package version
    error: str = ""
    # DKMS: the kernels the module is built for (those whose headers the plan has), and the running kernel
    # where it is not the one booted next and its headers are neither installed nor in the package index
    kernels: tuple[str, ...] = ()
    unbuilt: tuple[str, ...] = ()

    @property
    def hold(self) -> list[str]:
        return sorted(self.packages)


def check_request(request: DriverRequest) -> DriverRequest:
    """Validate what can be validated without the host; return the request with the branch set
    (still None when neither a branch nor a version is asked for: see :func:`resolve_source`)."""
    if request.flavor not in FLAVORS:
        raise DriverRequestError("flavor", f"flavor must be one of {', '.join(FLAVORS)}, got {request.flavor!r}")
    if request.version is not None and not is_driver_version(request.version):
        raise DriverRequestError(
            "version", f"version must be a full driver version like 580.126.20, got {request.version!r}"
        )
    branch = request.branch
    if branch is not None and not is_branch(branch):
        raise DriverRequestError("branch", f"branch must be three digits like '580', got {branch!r}")
    if request.version is not None:
        version_branch = branch_of(request.version)
        if branch is not None and branch != version_branch:
            raise DriverRequestError(
                "version", f"version {request.version!r} is not on branch {branch!r} (it is on {version_branch!r})"
            )
        branch = version_branch
    known: set[str] = set()
    for tables in (UBUNTU_BRANCHES, UBUNTU_TRANSITIONAL, DEBIAN_FAMILIES):
        for carried in tables.values():
            known |= set(carried)
    if branch is not None and branch not in known:
        argument = "branch" if request.branch else "version"
        raise DriverRequestError(argument, f"unknown driver branch {branch!r} (known: {', '.join(sorted(known))})")
    return DriverRequest(branch, request.version, request.flavor, request.allow_dkms, request.mok_enrolled)


def requested(wanted: DriverSettings) -> DriverRequest:
    """The driver the settings ask for, checked (:func:`check_request`: ``DriverRequestError`` naming the key)."""
    return check_request(
        DriverRequest(wanted.branch, wanted.version, wanted.flavor, wanted.allow_dkms, wanted.mok_enrolled)
    )


def resolve_source(source: str, request: DriverRequest, loaded: str | None) -> tuple[str, str]:
    """``("packages" | "preinstalled", "")``, or ``("", why the node cannot proceed)``.

    ``auto`` means packages when a branch or version is asked for, else the loaded driver.
    """
    if source not in DRIVER_SOURCES:
        return "", f"gpunode_driver_source must be one of {', '.join(DRIVER_SOURCES)}, got {source!r}"
    asked = request.branch is not None or request.version is not None
    if source == "packages" and not asked:
        return "", (
            "gpunode_driver_source is packages but no driver is asked for: set gpunode_driver_branch "
            "(e.g. 580) or gpunode_driver_version"
        )
    if source == "packages" or (source == "auto" and asked):
        return "packages", ""
    if not loaded:
        if source == "preinstalled":
            return "", "gpunode_driver_source is preinstalled but no NVIDIA driver is loaded on this node"
        return "", NO_DRIVER
    return "preinstalled", ""


def preinstalled_driver(driver: Mapping[str, Any], version: str | None) -> tuple[str, str]:
    """``(description, error)`` for a driver this project does not install (``NvidiaDriver`` fact).

    The description is ``driver <version> (<flavour>) preinstalled``; the error says why the loaded
    driver is refused (another version than ``version``)."""
    loaded = driver["kernel_module_version"]
    if version is not None and (not is_driver_version(loaded or "") or version_key(loaded) != version_key(version)):
        return "", f"gpunode_driver_version is {version} but the preinstalled NVIDIA driver loaded is {loaded}"
    return f"driver {loaded} ({driver['module_flavor'] or 'unknown flavour'}) preinstalled", ""


def foreign_driver(driver: Mapping[str, Any]) -> str:
    """Why packages must not be installed over this node's driver (one not from packages), or ``""``."""
    library = driver.get("library")
    if not driver["loaded"] or not library or driver.get("library_package"):
        return ""
    return (
        f"the loaded NVIDIA driver {driver['kernel_module_version']} was not installed from packages "
        f"({library} belongs to no package): installing driver packages beside it leaves two drivers. "
        "Keep it with gpunode_driver_source: preinstalled (or auto without a branch or version), or "
        "replace it with gpunode_driver_replace_preinstalled: true"
    )


def ubuntu_flavor(request: DriverRequest) -> str:
    """Canonical's package suffix: ``580``, ``580-server``, ``580-open``, ``580-server-open``."""
    suffix = "-server" if request.server else ""
    suffix += "-open" if request.open else ""
    return f"{request.branch}{suffix}"


def _debian_family(host: HostInfo, request: DriverRequest) -> tuple[str, str]:
    """(family, error) for Debian: family is ``current`` or ``tesla-535``."""
    families = DEBIAN_FAMILIES.get(host.release.split(".", 1)[0])
    if families is None:
        return "", f"Debian {host.release} is not supported (supported: {', '.join(DEBIAN_FAMILIES)})"
    family = families.get(request.branch or "")
    if family is None:
        return "", (
            f"driver branch {request.branch} is not in Debian {host.release} "
            f"(it carries: {', '.join(sorted(families))})"
        )
    if request.open and family != "current":
        return "", f"Debian has no open kernel module package for branch {request.branch}"
    return family, ""


def _debian_names(host: HostInfo, family: str, request: DriverRequest) -> tuple[list[str], list[str]]:
    """(userspace packages, DKMS packages) for a Debian family. ``nvidia-driver`` recommends, and so does not
    bring (recommendations are not installed), what a compute node needs: the CUDA driver library (``libcuda1``,
    which containers get through the toolkit) and ``nvidia-smi``; they are asked for by name. The headers of
    the running kernel,
    and of the kernel the node boots next where that is another, are part of the DKMS set (they
    bring the compiler): without them DKMS skips the build and the install still succeeds, leaving
    no module. The next boot kernel's are required; the running kernel's, where it is not the one
    booted next, only where installed or offered (:func:`plan_driver`)."""
    headers = [f"linux-headers-{kernel}" for kernel in host.kernels]
    if family == "current":
        module = "nvidia-open-kernel-dkms" if request.open else "nvidia-kernel-dkms"
        return ["nvidia-driver", "firmware-nvidia-gsp", "libcuda1", "nvidia-smi"], [module, *headers]
    # nvidia-persistenced needs a libnvidia-cfg1: the branch's own, so that no 550 library stays beside it
    userspace = [
        f"nvidia-{family}-driver",
        f"libnvidia-{family}-cuda1",
        f"nvidia-{family}-smi",
        f"libnvidia-{family}-cfg1",
    ]
    return userspace, [f"nvidia-{family}-kernel-dkms", *headers]


def _ubuntu_names(host: HostInfo, request: DriverRequest) -> tuple[list[str], list[str], list[str]]:
    """(userspace, precompiled module packages, DKMS packages) on Ubuntu."""
    flavor = ubuntu_flavor(request)
    userspace = [f"nvidia-headless-no-dkms-{flavor}", f"nvidia-utils-{flavor}"]
    precompiled = [f"linux-modules-nvidia-{flavor}-{host.kernel}"]
    if not request.open:
        precompiled.insert(0, f"linux-objects-nvidia-{flavor}-{host.kernel}")
        if host.arch == "amd64":
            precompiled.append(f"linux-signatures-nvidia-{host.kernel}")
    dkms = [f"nvidia-dkms-{flavor}", *(f"linux-headers-{kernel}" for kernel in host.kernels)]
    return userspace, precompiled, dkms


def host_error(host: HostInfo, request: DriverRequest) -> str:
    """Why this host can never get the requested driver, or ``""``."""
    if host.distro == "ubuntu":
        if host.release not in UBUNTU_RELEASES:
            return f"Ubuntu {host.release} is not supported (supported: {', '.join(UBUNTU_RELEASES)})"
        branches, transitional = UBUNTU_BRANCHES[host.release], UBUNTU_TRANSITIONAL[host.release]
        if request.branch in transitional:
            return (
                f"driver branch {request.branch} is retired on Ubuntu {host.release}: its packages are transitional "
                f"and pull in branch {transitional[request.branch]} (choose one of {', '.join(branches)})"
            )
        if request.branch not in branches:
            return f"driver branch {request.branch} is not in Ubuntu {host.release} (it carries: {', '.join(branches)})"
        return ""
    if host.distro == "debian":
        return _debian_family(host, request)[1]
    return f"distribution {host.distro} {host.release} is not supported (supported: debian, ubuntu)"


def wanted_names(host: HostInfo, request: DriverRequest) -> list[str]:
    """Every package name the plan may use on this host (to query the package index)."""
    if host_error(host, request):
        return []
    if host.distro == "ubuntu":
        userspace, precompiled, dkms = _ubuntu_names(host, request)
        return userspace + precompiled + dkms
    family, _ = _debian_family(host, request)
    userspace, dkms = _debian_names(host, family, request)
    return userspace + list(DEBIAN_COMPANIONS) + dkms


def _best(versions: Sequence[str], upstream: str) -> str | None:
    """The newest package version whose upstream part is ``upstream``."""
    matching = [v for v in versions if upstream_version(v) == upstream]
    return matching[0] if matching else None  # madison lists newest first


def _newest_upstream(versions: Sequence[str], branch: str) -> str | None:
    candidates = [
        upstream_version(v)
        for v in versions
        if is_driver_version(upstream_version(v)) and branch_of(upstream_version(v)) == branch
    ]
    return max(candidates, key=version_key) if candidates else None


def _secure_boot_gate(host: HostInfo, request: DriverRequest, reason: str) -> str:
    """Error when the DKMS path may not be taken, else ``""``."""
    if not request.allow_dkms:
        return f"{reason}, and DKMS is not allowed (allow_dkms is false)"
    if host.secure_boot is None and not request.mok_enrolled:
        return (
            f"{reason}; the Secure Boot state is unknown (neither the SecureBoot EFI variable nor "
            "`mokutil --sb-state` could be read), so DKMS is refused: were Secure Boot on, a DKMS-built module "
            "would be rejected unless its signing key is enrolled (declare it with mok_enrolled)"
        )
    if host.secure_boot and not request.mok_enrolled:
        return (
            f"{reason}; Secure Boot is on, so a DKMS-built module would be rejected unless its "
            "signing key is enrolled (declare it with mok_enrolled)"
        )
    return ""


def plan_driver(
    host: HostInfo,
    request: DriverRequest,
    installed: Mapping[str, str],
    available: Mapping[str, Sequence[str]] | None,
) -> DriverPlan:
    """Choose packages and exact versions.

    ``installed`` maps installed package names to versions; ``available`` maps names to the
    versions the package index offers, newest first (``None``: not queried; then only an
    installed, complete plan can be returned, else ``error == "query"``).
    """
    error = host_error(host, request)
    if error:
        return DriverPlan(error=error)

    if host.distro == "ubuntu":
        userspace, precompiled, dkms = _ubuntu_names(host, request)
        companions: tuple[str, ...] = ()
    else:
        family, _ = _debian_family(host, request)
        userspace, dkms = _debian_names(host, family, request)
        precompiled, companions = [], DEBIAN_COMPANIONS
    lead = userspace[0]

    version = request.version
    if version is None and lead in installed:
        version = upstream_version(installed[lead])
        if not is_driver_version(version) or branch_of(version) != request.branch:
            version = None
    optional = _optional_headers(host)
    if available is None:
        # Converged only when everything is installed at the wanted driver version.
        if version is None:
            return DriverPlan(error="query")
        for modules, method in ((precompiled, "precompiled"), (dkms, "dkms")):
            if not modules or not all(name in installed for name in modules if name not in optional):
                continue
            if method == "dkms" and _secure_boot_gate(host, request, "x"):
                continue
            names = userspace + [name for name in modules if name in installed]
            if all(name in installed for name in [*names, *companions]) and all(
                upstream_version(installed[name]) == version for name in names if not name.startswith("linux-")
            ):
                kept = {name: installed[name] for name in [*names, *companions]}
                kernels, unbuilt = _built_for(host, kept) if method == "dkms" else ((), ())
                return DriverPlan(version, method, kept, kernels=kernels, unbuilt=unbuilt)
        return DriverPlan(error="query")

    if version is None:
        version = _newest_upstream(available.get(lead, ()), request.branch or "")
        if version is None:
            hint = ""
            if host.distro == "debian" and not available.get(lead):
                hint = (
                    " (Debian carries it in the non-free component: add `contrib non-free "
                    "non-free-firmware` to the node's apt sources and run apt-get update)"
                )
            return DriverPlan(error=f"the package index offers no {lead} on branch {request.branch}{hint}")
    packages: dict[str, str] = {}
    for name in userspace:
        found = _best(available.get(name, ()), version)
        if found is None:
            return DriverPlan(error=f"the package index offers no {name} at driver version {version}")
        packages[name] = found

    if precompiled and all(available.get(name) for name in precompiled):
        for name in precompiled:
            packages[name] = installed.get(name) or available[name][0]
        return DriverPlan(version, "precompiled", packages)

    lrm = next((name for name in precompiled if name.startswith("linux-modules-")), "")
    reason = (
        f"no signed precompiled modules ({lrm}) exist for kernel {host.kernel}"
        if lrm
        else f"Debian builds the NVIDIA module for kernel {host.kernel} with DKMS"
    )
    error = _secure_boot_gate(host, request, reason)
    if error:
        return DriverPlan(error=error)
    for name in dkms:
        if name.startswith("linux-headers-"):
            if name in installed or name in available:
                packages[name] = installed.get(name) or ""
            elif name not in optional:
                return DriverPlan(
                    error=f"the package index offers no {name}: DKMS cannot build the module for kernel "
                    f"{name.removeprefix('linux-headers-')}, the one this node boots next"
                )
            continue
        found = _best(available.get(name, ()), version)
        if found is None:
            return DriverPlan(error=f"the package index offers no {name} at driver version {version}")
        packages[name] = found
    for name in companions:
        if name not in installed and not available.get(name):
            return DriverPlan(
                error=f"the package index offers no {name} (Debian carries it in the contrib component: add "
                "`contrib non-free non-free-firmware` to the node's apt sources and run apt-get update)"
            )
        packages[name] = installed.get(name) or available[name][0]
    kernels, unbuilt = _built_for(host, packages)
    return DriverPlan(version, "dkms", packages, kernels=kernels, unbuilt=unbuilt)


def _optional_headers(host: HostInfo) -> set[str]:
    """Headers a DKMS plan takes only where installed or offered: the running kernel's, where the node boots
    another one next (an old kernel's headers leave the archive; the new module loads after the reboot)."""
    return {f"linux-headers-{host.kernel}"} if host.next_kernel != host.kernel else set()


def _built_for(host: HostInfo, packages: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``kernels`` and ``unbuilt`` of a DKMS plan with ``packages``."""
    kernels = tuple(kernel for kernel in host.kernels if f"linux-headers-{kernel}" in packages)
    return kernels, tuple(kernel for kernel in host.kernels if kernel not in kernels)


def driver_set(plan: DriverPlan, packages: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The packages held as one with the driver, sorted: the plan's, and every installed driver package
    (``packages``: ``NvidiaHostState``'s, name -> its ``version``) of the driver's version: the userspace
    libraries, tools and module support the plan's packages pull in, so that no upgrade of one of them
    alone leaves a library of another version beside the module."""
    same = {name for name, found in packages.items() if upstream_version(str(found["version"])) == plan.version}
    return sorted(set(plan.packages) | same)


# The package that names a driver tree, per family: Debian's current and Tesla branches, Ubuntu's headless ones.
_LEAD = re.compile(r"nvidia-driver|nvidia-tesla-\d+-driver|nvidia-headless-no-dkms-\d+(-server)?(-open)?")


def previous_driver(packages: Mapping[str, Mapping[str, Any]], version: str) -> str:
    """The driver version the node's packages hold now (``packages``: ``NvidiaHostState``'s), where another
    than ``version``: the upstream version of its installed lead package (``nvidia-driver``,
    ``nvidia-tesla-535-driver``, ``nvidia-headless-no-dkms-580-server``); ``""`` where none, or several."""
    found = {upstream_version(str(package["version"])) for name, package in packages.items() if _LEAD.fullmatch(name)}
    found = {found_version for found_version in found if is_driver_version(found_version) and found_version != version}
    return found.pop() if len(found) == 1 else ""


# What apt takes as a package name and a version (Debian policy 5.6.1, 5.6.12): nothing else is passed on.
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,99}")
_PACKAGE_VERSION = re.compile(r"[0-9][A-Za-z0-9.+~:-]{0,99}")


def previous_set(packages: Mapping[str, Mapping[str, Any]], version: str) -> dict[str, str]:
    """The installed packages of driver ``version`` and its companions (``DEBIAN_COMPANIONS``, of versions of
    their own; ``packages``: ``NvidiaHostState``'s), name -> exact version: what puts that driver back where a
    change away from it fails after the install. A name or version apt would not take is left out (the
    node's text, never passed on)."""
    if not version:
        return {}
    return {
        name: str(package["version"])
        for name, package in sorted(packages.items())
        if (upstream_version(str(package["version"])) == version or name in DEBIAN_COMPANIONS)
        and _PACKAGE_NAME.fullmatch(name)
        and _PACKAGE_VERSION.fullmatch(str(package["version"]))
    }


def host_info(node: Mapping[str, Any]) -> HostInfo:
    """The host as the plan needs it, from ``NvidiaHostState``'s value."""
    return HostInfo(
        distro=node["distro"] or "",
        release=node["release"] or "",
        kernel=node["kernel"] or "",
        arch=node["arch"] or "amd64",
        secure_boot=node["secure_boot"],
        boot_kernel=node.get("boot_kernel") or "",
    )


@dataclass(frozen=True)
class DriverDecision:
    """What the driver step does on one node, decided from its ``NvidiaHostState`` (see :func:`decide_driver`)."""

    source: str  # "packages" or "preinstalled"; "" where the node cannot proceed (``error`` says why)
    loaded: Mapping[str, Any]  # the node's driver as ``NvidiaDriver`` reads it
    error: str = ""  # why the step fails the node
    description: str = ""  # the preinstalled driver the node keeps (``plan`` None)
    plan: DriverPlan | None = None  # the packages, where they are installed and held
    to_install: Mapping[str, str] = field(default_factory=dict)  # name -> exact version ("": any)
    to_hold: tuple[str, ...] = ()
    held_set: tuple[str, ...] = ()  # what is held as one once installed (:func:`driver_set`), as far as installed now
    replaces: str = ""  # the driver version the install replaces (:func:`previous_driver`), "" where none
    previous: Mapping[str, str] = field(default_factory=dict)  # its packages (:func:`previous_set`)
    index: tuple[str, ...] = ()  # read these names' versions from the package index, then decide again

    @property
    def keeps_own_driver(self) -> bool:
        """The node keeps the driver it has (no packages planned, no failure)."""
        return not self.error and self.plan is None and self.source == "preinstalled"

    @property
    def needs_reboot(self) -> bool:
        """The planned driver is not the loaded module (packages), or the userspace is newer than it (own driver)."""
        if self.plan is not None:
            return not same_driver(self.loaded["kernel_module_version"], self.plan.version)
        return bool(self.loaded["mismatch"])

    def versions(self, reboot: bool) -> tuple[str, str]:
        """The driver the node runs before the step (its loaded module, ``""``: none) and the one it runs after,
        where the step changes it (:meth:`changes` not empty); ``("", "")`` where it does not."""
        if not self.changes(reboot):
            return "", ""
        target = self.plan.version if self.plan is not None else self.loaded["userspace_version"]
        return str(self.loaded["kernel_module_version"] or ""), str(target or "")

    def changes(self, reboot: bool) -> list[str]:
        """The disruptive changes the step makes: ``driver: install …`` and (with ``reboot``) ``driver: reboot
        …``; ``[]`` where it only holds packages, changes nothing or fails the node."""
        loaded = self.loaded["kernel_module_version"]
        if self.error or self.index:
            return []
        if self.plan is None:
            if reboot and self.needs_reboot:
                return [f"driver: reboot ({loaded} loaded, {self.loaded['userspace_version']} installed)"]
            return []
        pins = " ".join(f"{name}={version}" if version else name for name, version in sorted(self.to_install.items()))
        replacing = f", replacing driver {self.replaces}" if self.replaces else ""
        changes = [f"driver: install {pins}{replacing}"] if self.to_install else []
        if reboot and self.needs_reboot:
            back = (
                f"; driver {self.replaces} put back where it does not load" if self.to_install and self.previous else ""
            )
            changes.append(f"driver: reboot ({loaded or 'no module'} loaded, {self.plan.version} installed){back}")
        return changes


def decide_driver(
    node: Mapping[str, Any],
    source: str,
    request: DriverRequest,
    replace_preinstalled: bool = False,
    downloaded: Mapping[str, str] | None = None,
    available: Mapping[str, Sequence[str]] | None = None,
) -> DriverDecision:
    """The driver step's decision on a node (``node``: ``NvidiaHostState``'s value; ``request`` checked by
    :func:`check_request`): where the driver comes from, why the node fails, the preinstalled driver it keeps,
    or the packages to install and hold.

    ``downloaded``: the packages fetched into apt's cache before the node's turn; the plan is then made from
    these and the installed ones only. ``available``: the package index's versions of the names a previous
    decision listed in ``index``; without it a plan that needs them is returned undecided, naming them.
    """
    loaded = node["driver"]
    chosen, error = resolve_source(source, request, loaded["kernel_module_version"])
    description = ""
    if chosen == "preinstalled":
        description, error = preinstalled_driver(loaded, request.version)
    elif chosen == "packages" and not replace_preinstalled:
        error = foreign_driver(loaded)
    if error or chosen != "packages":
        return DriverDecision(chosen, loaded, f"NVIDIA driver: {error}" if error else "", description)
    info = host_info(node)
    installed = {name: str(package["version"]) for name, package in node["packages"].items()}
    plan = plan_driver(info, request, installed, None)
    if plan.error == "query" and downloaded is not None:
        cached = {name: [version] if version else [] for name, version in {**installed, **downloaded}.items()}
        plan = plan_driver(info, request, installed, cached)
        if plan.error:
            plan.error += " (in the turn: among the packages downloaded before it and the installed ones)"
    elif plan.error == "query" and available is None:
        return DriverDecision(chosen, loaded, index=tuple(wanted_names(info, request)))
    elif plan.error == "query":
        plan = plan_driver(info, request, installed, available)
    if plan.error:
        return DriverDecision(chosen, loaded, f"NVIDIA driver {request.version or request.branch}: {plan.error}")
    held = {name for name, package in node["packages"].items() if package["held"]}
    whole = driver_set(plan, node["packages"])
    to_install = {
        name: version
        for name, version in plan.packages.items()
        if name not in installed or (version and installed[name] != version)
    }
    if to_install:  # named to the install too, as installed, so that replacing another driver keeps them
        to_install.update({name: plan.packages[name] for name in DEBIAN_COMPANIONS if name in plan.packages})
    replaces = previous_driver(node["packages"], plan.version) if to_install else ""
    return DriverDecision(
        chosen,
        loaded,
        plan=plan,
        to_install=to_install,
        to_hold=tuple(name for name in whole if name not in held),
        held_set=tuple(whole),
        replaces=replaces,
        previous=previous_set(node["packages"], replaces),
    )
