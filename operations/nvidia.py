"""Install and hold the NVIDIA driver, Fabric Manager and the NVIDIA Container Toolkit."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import FunctionCommand, OperationValueError, QuoteString, State, StringCommand, operation
from pyinfra.facts.server import Command

from pyinfra_gpunode import shell
from pyinfra_gpunode.driver_plan import (
    DRIVER_SOURCES,
    DriverPlan,
    DriverRequest,
    DriverRequestError,
    HostInfo,
    check_request,
    foreign_driver,
    plan_driver,
    preinstalled_driver,
    resolve_source,
    wanted_names,
)
from pyinfra_gpunode.driver_versions import same_driver, upstream_version
from pyinfra_gpunode.facts.nvidia import (
    TOOLKIT_KEYRING,
    TOOLKIT_LIST,
    TOOLKIT_PACKAGES,
    AptDownloads,
    AptDownloadsInfo,
    DriverInfo,
    NvidiaAptVersions,
    NvidiaContainerToolkit,
    NvidiaDriver,
    NvidiaHostState,
    NvidiaHostStateInfo,
    ToolkitInfo,
)
from pyinfra_gpunode.facts.operator import GpuOperatorState
from pyinfra_gpunode.hostdata import REBOOT_TIMEOUTS
from pyinfra_gpunode.log import logger, shown
from pyinfra_gpunode.operations import _lock
from pyinfra_gpunode.operations._atomic import fail as _fail
from pyinfra_gpunode.operations._atomic import write_file
from pyinfra_gpunode.operations._internals import current_state, in_a_run
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.operator import DRIVER_ROOT, driver_from_container
from pyinfra_gpunode.settings import DRIVER_FLAVOR, DRIVER_SOURCE, REBOOT_TIMEOUT, TOOLKIT_SOURCE
from pyinfra_gpunode.toolkit_plan import (
    ToolkitRequestError,
    check_toolkit,
    keyring_needs_pin,
    newest_common_version,
    toolkit_install,
    toolkit_source,
)

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
MODULE_WAIT = 60  # seconds a rebooted node's udev may take to load the nvidia module
# Waits (at most MODULE_WAIT s) for the module; exits 0 either way: the check after it names what is loaded.
MODULE_LOADED_WAIT = (
    f"i=0; while [ ! -e /sys/module/nvidia/version ] && [ $i -lt {MODULE_WAIT} ]; do sleep 1; i=$((i + 1)); done"
)
TOOLKIT_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
TOOLKIT_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
TOOLKIT_REPO_LINE = (
    f"deb [signed-by={TOOLKIT_KEYRING}] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
)


def _pins(packages: Mapping[str, str]) -> list[str]:
    """``name=version`` (``name`` where any version will do), sorted by name."""
    return [f"{name}={version}" if version else name for name, version in sorted(packages.items())]


def _install(packages: dict[str, str], download: bool = True) -> StringCommand:
    """apt-get install of exactly these versions; without ``download`` only from apt's cache (apt fails
    rather than fetch a file that is not there)."""
    return StringCommand(
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "NEEDRESTART_SUSPEND=1",
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        "--allow-change-held-packages",
        *([] if download else ["--no-download"]),
        *[QuoteString(pin) for pin in _pins(packages)],
    )


# Downloads into apt's cache, installing nothing; ends with apt's first error when it fails.
_DOWNLOAD_SCRIPT = shell.script(Path(__file__).parent / "shell" / "apt-download.sh")


def _download(packages: Mapping[str, str]) -> StringCommand:
    return StringCommand(shell.command(_DOWNLOAD_SCRIPT, "gpunode-download", *_pins(packages)))


def downloaded_packages(run: State, name: str) -> dict[str, str] | None:
    """What ``driver_downloaded`` and ``container_toolkit_downloaded`` put in node ``name``'s apt cache in
    this run (``{}``: nothing was needed); None where neither ran there."""
    found = run_state(run).downloaded.get(name)
    return None if found is None else dict(found)


def _record(packages: Mapping[str, str]) -> None:
    """Remember, for the node's turn, what is in its apt cache now (only once the run executes)."""
    if state.is_executing and in_a_run():
        run_state(current_state()).downloaded.setdefault(host.name, {}).update(packages)


def _size(total: int) -> str:
    return f"{total / 1e6:.1f} MB" if total >= 100_000 else f"{total / 1e3:.1f} kB"


def _downloaded(
    what: str, packages: dict[str, str], needed: AptDownloadsInfo | None = None
) -> Generator[Any, Any, None]:
    """Download ``packages`` (what the turn installs) into apt's cache; nothing when apt needs no file.
    ``needed``: apt's answer for them, when read already."""
    pins = _pins(packages)
    if needed is None:
        needed = host.get_fact(AptDownloads, packages=pins)
    if needed["error"]:
        yield _fail(f"{what}: apt cannot install {', '.join(pins)}: {shown(needed['error'], 200)}")
        return
    if not needed["files"]:
        _record(packages)
        if not state.is_executing:
            logger.info("%splan: %s in apt's cache: %s; the turn installs without downloading",
                        host.print_prefix, what, ", ".join(pins))  # fmt: skip
        host.noop(f"{what} packages are in apt's cache: {', '.join(pins)}")
        return
    if not state.is_executing:
        total = sum(found["size"] for found in needed["files"])
        logger.info("%splan: download before the turns: %s (%d files, %s); the turn installs without downloading",
                    host.print_prefix, ", ".join(pins), len(needed["files"]), _size(total))  # fmt: skip
    yield _download(packages)
    _record(packages)


def _hold(names: list[str]) -> StringCommand:
    return StringCommand("apt-mark", "hold", *[QuoteString(name) for name in sorted(names)])


def _host_info(facts: NvidiaHostStateInfo) -> HostInfo:
    return HostInfo(
        distro=facts["distro"] or "",
        release=facts["release"] or "",
        kernel=facts["kernel"] or "",
        arch=facts["arch"] or "amd64",
        secure_boot=facts["secure_boot"],
    )


@operation()
@locked_before_changes
def driver(
    source: str = DRIVER_SOURCE,
    branch: str | None = None,
    version: str | None = None,
    flavor: str = DRIVER_FLAVOR,
    allow_dkms: bool = False,
    mok_enrolled: bool = False,
    reboot: bool = False,
    replace_preinstalled: bool = False,
    reboot_timeout: int = REBOOT_TIMEOUT,
    downloaded: dict[str, str] | None = None,
) -> Generator[Any, Any, None]:
    """
    Install the NVIDIA driver pinned to an exact version and hold it, or accept the node's own.

    + source: ``packages`` (install and hold the driver's packages), ``preinstalled`` (never
      touch driver packages: the loaded driver is accepted, and must equal ``version`` when
      given) or ``auto`` (packages when a branch or version is given, else the loaded driver;
      a node with neither fails, and a dry run prints that as its plan)
    + branch: driver branch (``580``); with only a branch the newest version of it is taken
      once and then kept
    + version: exact driver version (``580.126.20``); implies the branch
    + flavor: Ubuntu package flavour: ``server`` (default), ``server-open``, ``default`` or
      ``open``; on Debian ``open``/``server-open`` choose ``nvidia-open-kernel-dkms``
    + allow_dkms: allow building the module with DKMS (Debian always does; Ubuntu only when
      Canonical ships no signed precompiled modules for the kernel)
    + mok_enrolled: the DKMS signing key is enrolled in the node's MOK list, so a DKMS build
      may be used while Secure Boot is on, or while the node cannot tell whether it is on
    + reboot: reboot when the installed driver differs from the loaded module (a preinstalled
      driver: when its userspace library differs from the loaded module), wait until the node
      answers with a new boot id, take the node lock again (when this run held it), wait up to
      60 s for the nvidia module to load, and check that the driver is loaded and matches
    + replace_preinstalled: with packages, install them even though the loaded driver's
      ``libnvidia-ml`` belongs to no package (a runfile or image driver); otherwise such a
      node fails naming the library
    + reboot_timeout: seconds the rebooted node may take to answer again (60 to 7200)
    + downloaded: the packages ``driver_downloaded`` put in apt's cache before (name -> exact version, as
      ``downloaded_packages`` returns them): the plan is made from these and the installed packages
      only, not from the package index, and the install never downloads (apt fails rather than fetch);
      ``None``: from the package index, downloading what is missing

    Ubuntu: ``nvidia-headless-no-dkms-<flavour>`` and ``nvidia-utils-<flavour>`` with
    Canonical's signed ``linux-modules-nvidia-<flavour>-<kernel>`` when they exist for the
    running kernel, else ``nvidia-dkms-<flavour>``. Retired branches whose packages are
    transitional are refused. Debian 12/13: ``nvidia-driver`` with ``nvidia-kernel-dkms`` or
    ``nvidia-open-kernel-dkms`` (``nvidia-tesla-535-*`` for branch 535 on Debian 13) and the
    running kernel's headers, which DKMS needs to build at all; when ``modinfo`` finds no nvidia
    module of the driver's version for the running kernel the host fails (apt itself reports
    success when DKMS built nothing; a module left from another version does not count). A node
    without an NVIDIA GPU is skipped.

    **Example:**

    .. code:: python

        nvidia.driver(name="NVIDIA driver 580", version="580.126.20", flavor="server-open")
        nvidia.driver(name="The image's own driver", source="preinstalled")
    """
    least, most = REBOOT_TIMEOUTS
    if isinstance(reboot_timeout, bool) or not isinstance(reboot_timeout, int) or not least <= reboot_timeout <= most:
        raise OperationValueError(
            f"reboot_timeout must be whole seconds from {least} to {most}, got {reboot_timeout!r}"
        )
    request = _driver_request(source, branch, version, flavor, allow_dkms, mok_enrolled)

    facts = node_fact(NvidiaHostState)
    if not facts["pci"]["gpus"]:
        host.noop("no NVIDIA GPU on this node; driver skipped")
        return
    error, description, plan = _planned(facts, source, request, replace_preinstalled, downloaded)
    if error:
        yield _fail(error)
        return
    if plan is None:
        yield from _preinstalled(description, facts["driver"], reboot, reboot_timeout)
        return
    info = _host_info(facts)
    installed = {name: str(pkg["version"]) for name, pkg in facts["packages"].items()}
    held = {name for name, pkg in facts["packages"].items() if pkg["held"]}
    to_install = _to_install(plan, installed)
    to_hold = [name for name in plan.hold if name not in held]
    if to_install:
        yield _install(to_install, download=downloaded is None)
    loaded = facts["driver"]["kernel_module_version"]
    if plan.method == "dkms" and not same_driver(loaded, plan.version):
        built = facts["built_module_version"]
        if to_install:  # read again after the install; a dry run installed nothing
            built = _built_version_now() if state.is_executing else plan.version
        if not same_driver(built, plan.version):
            found = f"version {built}" if built else "none"
            yield _fail(
                f"NVIDIA driver {plan.version} is installed but DKMS built no nvidia {plan.version} module for "
                f"kernel {info.kernel} (`modinfo -k {info.kernel} nvidia` finds {found}; see `dkms status` and "
                "/var/lib/dkms/*/*/build/make.log on the node)"
            )
            return
    if to_install or to_hold:
        yield _hold(plan.hold)

    needs_reboot = not same_driver(loaded, plan.version)
    if needs_reboot and reboot:
        yield from _rebooted(reboot_timeout)
        yield from _check_loaded(plan.version)
        return
    if not to_install and not to_hold:
        if needs_reboot:
            host.noop(
                f"NVIDIA driver {plan.version} is installed and held ({plan.method}); loaded module is "
                f"{loaded or 'none'}: reboot required"
            )
        else:
            host.noop(f"NVIDIA driver {plan.version} is installed, held and loaded ({plan.method})")


def _driver_request(
    source: str, branch: str | None, version: str | None, flavor: str, allow_dkms: bool, mok_enrolled: bool
) -> DriverRequest:
    if source not in DRIVER_SOURCES:
        raise OperationValueError(f"source must be one of {', '.join(DRIVER_SOURCES)}, got {source!r}")
    try:
        return check_request(DriverRequest(branch, version, flavor, allow_dkms, mok_enrolled))
    except DriverRequestError as exc:
        raise OperationValueError(str(exc)) from exc


@operation()
@locked_before_changes
def driver_downloaded(
    source: str = DRIVER_SOURCE,
    branch: str | None = None,
    version: str | None = None,
    flavor: str = DRIVER_FLAVOR,
    allow_dkms: bool = False,
    mok_enrolled: bool = False,
    replace_preinstalled: bool = False,
) -> Generator[Any, Any, None]:
    """
    Download the driver packages ``driver`` would install, at their exact versions, into apt's cache
    (``apt-get install --download-only``, with what they depend on), so that the install needs no
    network: on every node at once, before the rollout's turns, while the nodes still serve.

    + source: ``packages``, ``preinstalled`` or ``auto``, as for ``driver``
    + branch: driver branch (``580``), as for ``driver``
    + version: exact driver version (``580.126.20``), as for ``driver``
    + flavor: Ubuntu package flavour, as for ``driver``
    + allow_dkms: allow building the module with DKMS, as for ``driver``
    + mok_enrolled: the DKMS signing key is enrolled, as for ``driver``
    + replace_preinstalled: packages over a driver that belongs to no package, as for ``driver``

    Nothing is downloaded where the driver is installed at the planned version, the node keeps its
    own driver, or apt finds every file in ``/var/cache/apt/archives`` already. Where ``driver``
    would fail the node (no package at the version, DKMS refused), or apt cannot install or fetch
    the packages, the node fails here. Pass what was downloaded to ``driver`` as ``downloaded``
    (``downloaded_packages``): it then installs exactly these. A dry run downloads nothing and writes
    nothing under ``/var/cache/apt``: its plan lists the packages and their size.

    **Example:**

    .. code:: python

        nvidia.driver_downloaded(name="NVIDIA driver 580: downloaded", version="580.126.20", flavor="server-open")
    """
    request = _driver_request(source, branch, version, flavor, allow_dkms, mok_enrolled)
    facts = node_fact(NvidiaHostState)
    if not facts["pci"]["gpus"]:
        host.noop("no NVIDIA GPU on this node; no driver to download")
        return
    error, _, plan = _planned(facts, source, request, replace_preinstalled)
    if error:
        yield _fail(error)
        return
    if plan is None:
        _record({})
        host.noop("the node keeps its own driver: nothing to download")
        return
    installed = {name: str(pkg["version"]) for name, pkg in facts["packages"].items()}
    to_install = _to_install(plan, installed)
    if not to_install:
        _record({})
        host.noop(f"NVIDIA driver {plan.version} is installed: nothing to download")
        return
    yield from _downloaded(f"NVIDIA driver {plan.version}", to_install)


def driver_changes(
    source: str = DRIVER_SOURCE,
    branch: str | None = None,
    version: str | None = None,
    flavor: str = DRIVER_FLAVOR,
    allow_dkms: bool = False,
    mok_enrolled: bool = False,
    reboot: bool = False,
    replace_preinstalled: bool = False,
    reboot_timeout: int = REBOOT_TIMEOUT,
) -> list[str]:
    """The disruptive changes ``driver`` would make on this host with the same arguments (reads
    facts, changes nothing): ``driver: install …`` and ``driver: reboot …``; ``[]`` where it would
    only hold packages, change nothing, or fail the host."""
    try:
        request = check_request(DriverRequest(branch, version, flavor, allow_dkms, mok_enrolled))
    except DriverRequestError:
        return []
    facts = node_fact(NvidiaHostState)
    if source not in DRIVER_SOURCES or not facts["pci"]["gpus"]:
        return []
    error, _, plan = _planned(facts, source, request, replace_preinstalled)
    loaded = facts["driver"]["kernel_module_version"]
    if error:
        return []
    if plan is None:
        if reboot and facts["driver"]["mismatch"]:
            return [f"driver: reboot ({loaded} loaded, {facts['driver']['userspace_version']} installed)"]
        return []
    installed = {name: str(pkg["version"]) for name, pkg in facts["packages"].items()}
    to_install = _to_install(plan, installed)
    changes = [f"driver: install {' '.join(f'{n}={v}' if v else n for n, v in sorted(to_install.items()))}"]
    changes = changes if to_install else []
    if reboot and not same_driver(loaded, plan.version):
        changes.append(f"driver: reboot ({loaded or 'no module'} loaded, {plan.version} installed)")
    return changes


def _planned(
    facts: NvidiaHostStateInfo,
    source: str,
    request: DriverRequest,
    replace_preinstalled: bool,
    downloaded: Mapping[str, str] | None = None,
) -> tuple[str, str, DriverPlan | None]:
    """``(error, description, plan)``: why the host fails, or the preinstalled driver it keeps
    (``plan`` None), or the package plan; with ``downloaded``, made from those packages and the
    installed ones only, never from the package index."""
    chosen, error = resolve_source(source, request, facts["driver"]["kernel_module_version"])
    description = ""
    if chosen == "preinstalled":
        description, error = preinstalled_driver(facts["driver"], request.version)
    elif chosen == "packages" and not replace_preinstalled:
        error = foreign_driver(facts["driver"])
    if error or chosen == "preinstalled":
        return (f"NVIDIA driver: {error}" if error else ""), description, None
    info = _host_info(facts)
    installed = {name: str(pkg["version"]) for name, pkg in facts["packages"].items()}
    plan = plan_driver(info, request, installed, None)
    if plan.error == "query" and downloaded is not None:
        cached = {name: [version] for name, version in {**installed, **downloaded}.items() if version}
        plan = plan_driver(info, request, installed, cached)
        if plan.error:
            plan.error += " (in the turn: among the packages downloaded before it and the installed ones)"
    elif plan.error == "query":
        available = host.get_fact(NvidiaAptVersions, packages=wanted_names(info, request))
        plan = plan_driver(info, request, installed, available)
    if plan.error:
        return f"NVIDIA driver {request.version or request.branch}: {plan.error}", "", None
    return "", "", plan


def _to_install(plan: DriverPlan, installed: dict[str, str]) -> dict[str, str]:
    return {n: v for n, v in plan.packages.items() if n not in installed or (v and installed[n] != v)}


def _from_driver_container(loaded: DriverInfo) -> bool:
    operator = node_fact(GpuOperatorState)
    return driver_from_container(loaded, operator)


def _preinstalled(description: str, loaded: DriverInfo, reboot: bool, timeout: int) -> Generator[Any, Any, None]:
    """Accept the node's own driver: nothing to run (the plan says so), or with ``reboot`` the
    reboot a userspace newer than the loaded module waits for, and the check after it."""
    if loaded["mismatch"] and reboot:
        if not state.is_executing:
            logger.info("%splan: %s; reboot into its userspace %s", host.print_prefix, description,
                        loaded["userspace_version"])  # fmt: skip
        yield from _rebooted(timeout)
        yield from _check_loaded(loaded["userspace_version"])
        return
    if loaded["mismatch"]:
        description += f"; its userspace library is {loaded['userspace_version']}: reboot pending"
    elif not loaded["userspace_version"] and _from_driver_container(loaded):
        description += f"; its userspace is the GPU Operator's driver container's ({DRIVER_ROOT})"
    elif not loaded["userspace_version"]:
        description += "; the loader finds no libnvidia-ml.so.1 for it"
    if not state.is_executing:
        logger.info("%splan: %s", host.print_prefix, description)
    host.noop(description)


def _built_version_now() -> str | None:
    """After an install: the version of the nvidia module for the running kernel (read again)."""
    return host.get_fact(NvidiaHostState)["built_module_version"]


def _rebooted(timeout: int) -> Generator[Any, Any, None]:
    """Reboot the node, wait up to ``timeout`` s until it answers again with a new boot id (reconnecting),
    take the node lock again if this run held it (its holder ended with the boot: every later command
    runs locked), then wait up to ``MODULE_WAIT`` s for udev to load the nvidia module."""
    boot: list[str] = []

    def remember(state: Any, host: Any) -> bool:
        boot.append(host.get_fact(Command, BOOT_ID))
        return True

    def back(state: Any, host: Any) -> bool:
        deadline = time.monotonic() + timeout
        host.disconnect()
        while time.monotonic() < deadline:
            time.sleep(2)
            host.connect(show_errors=False)
            if host.connected:
                try:
                    if host.get_fact(Command, BOOT_ID) not in ("", boot[0]):
                        return True
                except Exception:  # the old connection's last moments: try again
                    pass
                host.disconnect()
        logger.error("%sthe node did not come back within %d s of its reboot", host.print_prefix, timeout)
        return False

    yield FunctionCommand(remember, (), {})
    yield StringCommand("sh", "-c", QuoteString("(sleep 1 && systemctl reboot) </dev/null >/dev/null 2>&1 &"))
    yield FunctionCommand(back, (), {})
    run = current_state()
    if _lock.holds(run, host.name):
        _lock.lost(run, host.name)
        yield from _lock.take()
    yield StringCommand("sh", "-c", QuoteString(MODULE_LOADED_WAIT))


def _check_loaded(version: str | None) -> Generator[Any, Any, None]:
    """After a reboot: fail the host unless driver ``version`` is loaded and matches its userspace."""
    if not state.is_executing:
        return
    now = host.get_fact(NvidiaDriver)
    if not same_driver(now["kernel_module_version"], version) or now["mismatch"]:
        yield _fail(
            f"after the reboot the loaded NVIDIA module is {now['kernel_module_version'] or 'none'} "
            f"(userspace {now['userspace_version'] or 'none'}), not {version}"
        )
    else:
        logger.info("%sdriver %s loaded after the reboot", host.print_prefix, version)


@operation()
@locked_before_changes
def fabric_manager(version: str | None = None, preinstalled: bool = False) -> Generator[Any, Any, None]:
    """
    Install Fabric Manager at exactly the loaded driver's version, held, on NVSwitch systems only.

    + version: driver version Fabric Manager must match; default the loaded module's version
    + preinstalled: the driver was installed outside the package manager (``driver`` with
      ``source="preinstalled"``), which brings its own Fabric Manager: only check that
      ``nvidia-fabricmanager.service`` is active, never install or hold a package

    Ubuntu: ``nvidia-fabricmanager-<branch>``; Debian does not package Fabric Manager, so an
    NVSwitch system on Debian fails with a message. PCIe-only systems are skipped (Fabric
    Manager refuses to start there).

    **Example:**

    .. code:: python

        nvidia.fabric_manager(name="Fabric Manager on NVSwitch systems")
    """
    if version is not None and not re.match(r"^\d+\.\d+(\.\d+)?$", version):
        raise OperationValueError(f"version must be a driver version like 580.126.20, got {version!r}")
    facts = node_fact(NvidiaHostState)
    if not facts["pci"]["nvswitch"]:
        host.noop("no NVSwitch on this node; Fabric Manager not needed")
        return
    target = version or facts["driver"]["kernel_module_version"]
    if not target:
        yield _fail("Fabric Manager: no NVIDIA driver is loaded and no version was given")
        return
    fm = facts["fabric_manager"]
    if preinstalled:
        if fm["active"] == "active":
            host.noop(f"Fabric Manager is active beside the preinstalled driver {target}")
        else:
            yield _fail(
                f"Fabric Manager: nvidia-fabricmanager.service is {fm['active'] or 'missing'} on this NVSwitch node; "
                f"install and start the Fabric Manager of the preinstalled driver {target} as the driver was installed"
            )
        return
    if facts["distro"] != "ubuntu":
        yield _fail(f"Fabric Manager: no package for distribution {facts['distro']} (supported: ubuntu)")
        return
    name = f"nvidia-fabricmanager-{target.split('.', 1)[0]}"
    current = fm["packages"].get(name)
    if current and upstream_version(current) == target and name in fm["held"] and fm["enabled"] == "enabled":
        host.noop(f"Fabric Manager {target} is installed, held and enabled")
        return
    if not current or upstream_version(current) != target:
        available = host.get_fact(NvidiaAptVersions, packages=[name])
        match = [v for v in available.get(name, []) if upstream_version(v) == target]
        if not match:
            yield _fail(f"Fabric Manager: the package index offers no {name} at version {target}")
            return
        yield _install({name: match[0]})
    yield _hold([name])
    yield StringCommand("systemctl", "enable", "--now", "nvidia-fabricmanager.service")


@operation()
@locked_before_changes
def container_toolkit(
    source: str = TOOLKIT_SOURCE,
    version: str | None = None,
    deb_dir: str | None = None,
    downloaded: dict[str, str] | None = None,
) -> Generator[Any, Any, None]:
    """
    Install the NVIDIA Container Toolkit pinned to one version and held, or check it.

    + source: ``repository`` (NVIDIA's apt repository; its key is accepted only with the
      pinned fingerprint ``C95B321B…F796ECB0``), ``deb_dir`` (``.deb`` files already on the
      node, for air-gapped sites), ``installed`` (only check what is there: its four packages,
      or ``nvidia-ctk`` and ``nvidia-container-runtime`` on PATH outside the package manager)
      or ``auto`` (``installed`` when the toolkit is there, else ``repository``)
    + version: toolkit package version (``1.17.8-1``), the same for all four packages; without
      it ``repository`` installs the newest version the repository offers once, then keeps it
    + deb_dir: directory on the node holding the four ``.deb`` files (``source="deb_dir"``)
    + downloaded: the packages ``container_toolkit_downloaded`` put in apt's cache before (name ->
      exact version, as ``downloaded_packages`` returns them): from the repository, the version
      downloaded is installed from apt's cache, with no ``apt-get update`` and no download (apt
      fails rather than fetch); ``None``: the repository is read and the packages downloaded here

    **Example:**

    .. code:: python

        nvidia.container_toolkit(name="NVIDIA Container Toolkit", version="1.17.8-1")
        nvidia.container_toolkit(name="Toolkit from a local mirror", source="deb_dir",
                                 version="1.17.8-1", deb_dir="/srv/debs/nvidia")
    """
    try:
        version = check_toolkit(source, version, deb_dir)
    except ToolkitRequestError as exc:
        raise OperationValueError(str(exc)) from exc

    toolkit = node_fact(NvidiaContainerToolkit)
    packages, held = toolkit["packages"], set(toolkit["held"])
    complete = all(name in packages for name in TOOLKIT_PACKAGES)
    found_outside = bool(toolkit.get("ctk_path") and toolkit["runtime_binary"])
    source = toolkit_source(source, version, packages if complete else {}, found_outside)
    # A keyring with any key but exactly the pinned one lets that key sign the repository: replaced,
    # on every run where apt reads the repository (its list file is there), the toolkit installed or not.
    keyring_wrong = keyring_needs_pin(
        source, toolkit["repo_list"] is not None, toolkit["keyring_fingerprints"], TOOLKIT_FINGERPRINT
    )
    if keyring_wrong:
        yield StringCommand(keyring_script())
    if source == "installed":
        yield from _toolkit_checked(toolkit, version, quiet=keyring_wrong)
        return
    if version is None and complete and len({packages[n] for n in TOOLKIT_PACKAGES}) == 1:
        version = packages["nvidia-container-toolkit"]  # the version taken once is kept
    versions_ok = complete and all(packages[n] == version for n in TOOLKIT_PACKAGES)

    if versions_ok and all(n in held for n in TOOLKIT_PACKAGES) and toolkit["runtime_binary"]:
        if not keyring_wrong:
            host.noop(f"NVIDIA Container Toolkit {packages['nvidia-container-toolkit']} is installed and held")
        return

    if not versions_ok:
        if source == "repository" and downloaded is not None:
            version = version or _toolkit_version(downloaded)
            if version is None:
                yield _fail("NVIDIA Container Toolkit: no version of it was downloaded before the turn")
                return
            yield _install({name: version for name in TOOLKIT_PACKAGES}, download=False)
        elif source == "repository":
            if not toolkit["keyring_fingerprints"]:
                yield StringCommand(keyring_script())
            if toolkit["repo_list"] != TOOLKIT_REPO_LINE:
                yield from write_file(TOOLKIT_LIST, TOOLKIT_REPO_LINE)
            yield StringCommand("apt-get", "update")
            if version is None:  # read once the repository is known: the newest version, then kept
                offered = host.get_fact(NvidiaAptVersions, packages=list(TOOLKIT_PACKAGES))
                version = newest_common_version(offered, TOOLKIT_PACKAGES)
                if version is None:
                    yield _fail("NVIDIA Container Toolkit: the repository offers no version of all four packages")
                    return
            yield _install({name: version for name in TOOLKIT_PACKAGES})
        else:
            assert deb_dir is not None
            yield _install_debs(deb_dir, version)
    yield _hold(list(TOOLKIT_PACKAGES))


def _toolkit_version(downloaded: Mapping[str, str]) -> str | None:
    """The one version all four toolkit packages were downloaded at, or None."""
    versions = {downloaded.get(name) for name in TOOLKIT_PACKAGES}
    return versions.pop() if len(versions) == 1 else None


@operation()
@locked_before_changes
def container_toolkit_downloaded(
    source: str = TOOLKIT_SOURCE, version: str | None = None, deb_dir: str | None = None
) -> Generator[Any, Any, None]:
    """
    Download the NVIDIA Container Toolkit packages ``container_toolkit`` would install into apt's cache
    (``apt-get install --download-only``), so that the install needs no network: on every node at
    once, before the rollout's turns, while the nodes still serve.

    + source: ``repository``, ``deb_dir``, ``installed`` or ``auto``, as for ``container_toolkit``
    + version: toolkit package version (``1.17.8-1``); without it the newest the repository offers
    + deb_dir: directory on the node holding the ``.deb`` files (``source="deb_dir"``): nothing to download

    From NVIDIA's repository it first does what the install would do there: the keyring with the
    pinned key, the list file, ``apt-get update``, and without a version the choice of the newest
    version the repository offers, so the install takes exactly what was downloaded (pass it as
    ``downloaded``, from ``downloaded_packages``). A keyring holding another key is pinned here too.
    Nothing is downloaded where the toolkit is installed at the version, is only checked
    (``installed``), comes from ``deb_dir`` (files already on the node), or apt finds the files in
    ``/var/cache/apt/archives`` with the repository already read. A dry run changes nothing.

    **Example:**

    .. code:: python

        nvidia.container_toolkit_downloaded(name="NVIDIA Container Toolkit: downloaded", version="1.17.8-1")
    """
    try:
        version = check_toolkit(source, version, deb_dir)
    except ToolkitRequestError as exc:
        raise OperationValueError(str(exc)) from exc
    toolkit = node_fact(NvidiaContainerToolkit)
    packages = toolkit["packages"]
    complete = all(name in packages for name in TOOLKIT_PACKAGES)
    found_outside = bool(toolkit.get("ctk_path") and toolkit["runtime_binary"])
    chosen = toolkit_source(source, version, packages if complete else {}, found_outside)
    keyring_wrong = keyring_needs_pin(
        chosen, toolkit["repo_list"] is not None, toolkit["keyring_fingerprints"], TOOLKIT_FINGERPRINT
    )
    if keyring_wrong:
        yield StringCommand(keyring_script())
    target = toolkit_install(source, version, packages, found_outside, TOOLKIT_PACKAGES)
    if target is None or chosen != "repository":
        _record({})
        if not keyring_wrong:
            where = "its .deb files are on the node (deb_dir)" if target is not None else "it is installed"
            host.noop(f"NVIDIA Container Toolkit: {where}; nothing to download")
        return
    configured = bool(toolkit["keyring_fingerprints"]) and toolkit["repo_list"] == TOOLKIT_REPO_LINE
    if target and configured and not keyring_wrong:  # the index read before may offer the version already
        pins = dict.fromkeys(TOOLKIT_PACKAGES, target)
        needed = host.get_fact(AptDownloads, packages=_pins(pins))
        if not needed["error"]:
            yield from _downloaded(f"NVIDIA Container Toolkit {target}", pins, needed)
            return
    if not state.is_executing:
        logger.info("%splan: download before the turns: NVIDIA Container Toolkit %s from NVIDIA's repository "
                    "(keyring, list file and apt-get update first); the turn installs without downloading",
                    host.print_prefix, target or "at the newest version offered")  # fmt: skip
    if not toolkit["keyring_fingerprints"]:
        yield StringCommand(keyring_script())
    if toolkit["repo_list"] != TOOLKIT_REPO_LINE:
        yield from write_file(TOOLKIT_LIST, TOOLKIT_REPO_LINE)
    yield StringCommand("apt-get", "update")
    if not target:  # read once the repository is known: the newest version, then kept
        offered = host.get_fact(NvidiaAptVersions, packages=list(TOOLKIT_PACKAGES))
        target = newest_common_version(offered, TOOLKIT_PACKAGES)
        if target is None:
            yield _fail("NVIDIA Container Toolkit: the repository offers no version of all four packages")
            return
    pins = dict.fromkeys(TOOLKIT_PACKAGES, target)
    yield _download(pins)
    _record(pins)


def toolkit_changes(source: str = TOOLKIT_SOURCE, version: str | None = None, deb_dir: str | None = None) -> list[str]:
    """The disruptive change ``container_toolkit`` would make on this host with the same arguments (reads
    facts, changes nothing): ``toolkit: install …`` where it installs or upgrades the packages, whose
    postinst reloads systemd and (1.18 and later) starts the CDI refresh; ``[]`` where it would only
    hold them, check them, change nothing or fail the host."""
    try:
        version = check_toolkit(source, version, deb_dir)
    except ToolkitRequestError:
        return []
    toolkit = node_fact(NvidiaContainerToolkit)
    packages = toolkit["packages"]
    found_outside = bool(toolkit.get("ctk_path") and toolkit["runtime_binary"])
    target = toolkit_install(source, version, packages, found_outside, TOOLKIT_PACKAGES)
    if target is None:
        return []
    installed = packages.get("nvidia-container-toolkit") or "none"
    return [f"toolkit: install {target or 'the newest version offered'} (installed: {installed})"]


def _toolkit_checked(toolkit: ToolkitInfo, version: str | None, quiet: bool = False) -> Generator[Any, Any, None]:
    """``installed``: the toolkit's packages, or its two binaries on PATH without them, at ``version``
    (``quiet``: a command was yielded before, so a right toolkit is no no-op)."""
    packages = toolkit["packages"]
    if all(name in packages for name in TOOLKIT_PACKAGES):
        found = packages["nvidia-container-toolkit"]
        if version is not None and any(packages[n] != version for n in TOOLKIT_PACKAGES):
            yield _fail(f"NVIDIA Container Toolkit is {found}, not {version}")
        elif not toolkit["runtime_binary"]:
            yield _fail("NVIDIA Container Toolkit is installed but nvidia-container-runtime is not on PATH")
        elif not quiet:
            host.noop(f"NVIDIA Container Toolkit {found} is installed")
    elif toolkit.get("ctk_path") and toolkit["runtime_binary"]:
        found = toolkit["ctk_version"] or "of unknown version"
        if version is not None and found != upstream_version(version):
            yield _fail(f"NVIDIA Container Toolkit found outside the package manager is {found}, not {version}")
        elif not quiet:
            host.noop(
                f"NVIDIA Container Toolkit {found} is installed outside the package manager: "
                f"{toolkit.get('ctk_path')}, {toolkit['runtime_binary']}"
            )
    else:
        missing = [n for n in TOOLKIT_PACKAGES if n not in packages]
        on_path = [n for n, key in (("nvidia-ctk", "ctk_path"), ("nvidia-container-runtime", "runtime_binary"))
                   if not toolkit.get(key)]  # fmt: skip
        yield _fail(
            f"NVIDIA Container Toolkit is not installed (missing packages: {', '.join(missing) or '-'}; "
            f"not on PATH: {', '.join(on_path)})"
        )


# The script without its comment lines (it has no here-documents): what the node runs.
_KEYRING_SCRIPT = shell.script(Path(__file__).parent / "shell" / "toolkit-keyring.sh")


def keyring_script(
    fingerprint: str = TOOLKIT_FINGERPRINT, url: str = TOOLKIT_KEY_URL, keyring: str = TOOLKIT_KEYRING
) -> str:
    """Shell that downloads the key file at ``url`` and writes exactly the key ``fingerprint`` to ``keyring``
    (``shell/toolkit-keyring.sh``, its arguments quoted).

    The key file is imported into a throwaway gpg home and only the pinned key is exported from it,
    so other keys in the file never reach the keyring; it fails naming what the file holds when the
    pinned key is not among them.
    """
    return shell.command(_KEYRING_SCRIPT, "gpunode-keyring", fingerprint, url, keyring)


def _install_debs(deb_dir: str, version: str | None) -> StringCommand:
    """apt-get install of the four packages' .deb files from ``deb_dir`` (one version)."""
    pattern = version or "*"
    folder = shlex.quote(deb_dir.rstrip("/") + "/")
    paths = " ".join(f"{folder}{name}_{pattern}_*.deb" for name in TOOLKIT_PACKAGES)
    return StringCommand(
        "env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y --no-install-recommends "
        f"--allow-change-held-packages {paths}"
    )
