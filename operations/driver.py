"""Install and hold the NVIDIA driver pinned to an exact version, or accept the node's own."""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from typing import Any

from pyinfra import host, state
from pyinfra.api import FunctionCommand, OperationValueError, QuoteString, StringCommand, operation
from pyinfra.facts.server import Command

from pyinfra_gpunode.built_module import built_modules, module_problem
from pyinfra_gpunode.driver_plan import (
    DRIVER_SOURCES,
    DriverDecision,
    DriverRequestError,
    decide_driver,
    driver_set,
    host_info,
    requested,
)
from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.driver import DriverInfo, NvidiaDriver, NvidiaHostState
from pyinfra_gpunode.facts.operator import GpuOperatorState
from pyinfra_gpunode.facts.package_index import NvidiaAptVersions
from pyinfra_gpunode.hostdata import REBOOT_TIMEOUTS
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import _lock, _packages
from pyinfra_gpunode.operations._atomic import fail as _fail
from pyinfra_gpunode.operations._internals import current_state
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import decided_once, node_fact
from pyinfra_gpunode.operator import DRIVER_ROOT, driver_from_container
from pyinfra_gpunode.settings import DRIVER_FLAVOR, DRIVER_SOURCE, REBOOT_TIMEOUT, DriverSettings

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
MODULE_WAIT = 60  # seconds a rebooted node's udev may take to load the nvidia module
# Waits (at most MODULE_WAIT s) for the module, no longer once the boot is over and udev has nothing queued (no
# module loads after that); exits 0 either way: the check after it names what is loaded.
MODULE_LOADED_WAIT = (
    f"i=0; while [ ! -e /sys/module/nvidia/version ] && [ $i -lt {MODULE_WAIT} ]; do "
    "case $(systemctl is-system-running 2>/dev/null) in running | degraded) "
    "udevadm settle --timeout=10 >/dev/null 2>&1; [ -e /sys/module/nvidia/version ] || break ;; esac; "
    "sleep 1; i=$((i + 1)); done"
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
      60 s for the nvidia module to load, and check that the driver is loaded and matches; where
      the driver this step installed in place of another is not, the other's packages are put back
      from apt's cache (``driver_downloaded`` keeps them there), the node rebooted into it and
      checked, and the host fails naming both
    + replace_preinstalled: with packages, install them even though the loaded driver's
      ``libnvidia-ml`` belongs to no package (a runfile or image driver); otherwise such a
      node fails naming the library
    + reboot_timeout: seconds the rebooted node may take to answer again (60 to 7200)
    + downloaded: the packages ``driver_downloaded`` put in apt's cache before (name -> exact version, as
      ``downloaded_packages`` returns them): the plan is made from these and the installed packages
      only, not from the package index, and the install never downloads (apt fails rather than fetch);
      ``None``: from the package index, downloading what is missing

    Ubuntu: ``nvidia-headless-no-dkms-<flavour>`` and ``nvidia-utils-<flavour>`` with Canonical's signed
    ``linux-modules-nvidia-<flavour>-<kernel>`` when they exist for the running kernel, else
    ``nvidia-dkms-<flavour>``. Retired branches whose packages are transitional are refused. Debian
    12/13: ``nvidia-driver``, ``libcuda1`` and ``nvidia-smi`` with ``nvidia-kernel-dkms`` or
    ``nvidia-open-kernel-dkms`` (``nvidia-tesla-535-*`` for branch 535 on Debian 13, with
    ``libnvidia-tesla-535-cfg1``), ``nvidia-persistenced`` (contrib, at its own version; kept through a
    change of driver) and the headers of the kernel the node boots next (and of the running one where
    installed or offered), which DKMS needs to build at all. After a DKMS install, for each kernel built
    for, the module ``modprobe nvidia`` loads must be of the driver's version (apt itself reports
    success when DKMS built nothing; a module left from another version does not count), built for that
    kernel (its vermagic) and, where Secure Boot is on or unknown, signed; else the host fails. The
    driver's whole set is held: the planned packages and every installed package of its version. Another
    driver installed from packages is replaced: its packages stay until the new ones are installed and
    built, then those nothing needs are removed; where the install fails, the node is put back (the new
    packages removed, the old ones at their versions and held) and fails naming the DKMS build log's
    last lines. A node without an NVIDIA GPU is skipped.

    **Example:**

    .. code:: python

        driver.driver(name="NVIDIA driver 580", version="580.126.20", flavor="server-open")
        driver.driver(name="The image's own driver", source="preinstalled")
    """
    least, most = REBOOT_TIMEOUTS
    if isinstance(reboot_timeout, bool) or not isinstance(reboot_timeout, int) or not least <= reboot_timeout <= most:
        raise OperationValueError(
            f"reboot_timeout must be whole seconds from {least} to {most}, got {reboot_timeout!r}"
        )
    wanted = DriverSettings(source, branch, version, flavor, allow_dkms, mok_enrolled, reboot, reboot_timeout,
                            replace_preinstalled)  # fmt: skip
    _driver_request(wanted)
    facts = node_fact(NvidiaHostState)
    if not facts["pci"]["gpus"]:
        host.noop("no NVIDIA GPU on this node; driver skipped")
        return
    decided = decision(wanted, downloaded)
    if decided.error:
        yield _fail(decided.error)
        return
    if decided.plan is None:
        yield from _preinstalled(decided.description, facts["driver"], reboot, reboot_timeout)
        return
    plan, to_install = decided.plan, dict(decided.to_install)
    if to_install and plan.unbuilt:
        logger.warning(
            "%sDKMS builds the nvidia %s module for kernel %s only: the running kernel %s has no headers installed "
            "or in the package index; the driver loads after the reboot into %s", host.print_prefix,
            plan.version, ", ".join(plan.kernels), ", ".join(plan.unbuilt), host_info(facts).next_kernel,
        )  # fmt: skip
    if to_install and not state.is_executing:
        replacing = (
            f"; once it is installed and built, driver {decided.replaces}'s packages apt no longer needs are removed"
            if decided.replaces
            else ""
        )
        logger.info("%splan: install %s%s; hold as one: %s, and every package of driver %s the install pulls in; "
                    "where the install fails, the node is put back as it was", host.print_prefix,
                    " ".join(_packages.pins_of(to_install)), replacing, ", ".join(decided.held_set),
                    plan.version)  # fmt: skip
    if to_install and decided.previous and reboot and not state.is_executing:
        logger.info("%splan: reboot into driver %s; where it is not loaded after the reboot, driver %s's packages "
                    "are put back from apt's cache and the node rebooted into it", host.print_prefix,
                    plan.version, decided.replaces)  # fmt: skip
    if to_install:
        yield _packages.install_built(to_install, plan.version, decided.replaces, download=downloaded is None)
    loaded = facts["driver"]["kernel_module_version"]
    # after an install the node is read again (a dry run installed nothing: what it would be is not known)
    after = host.get_fact(NvidiaHostState) if to_install and state.is_executing else None
    if plan.method == "dkms" and not same_driver(loaded, plan.version) and (after or not to_install):
        modules = built_modules(after or facts)
        for kernel in plan.kernels:
            problem = module_problem(modules[kernel], plan.version, facts["secure_boot"])
            if problem:
                yield _fail(problem)
                return
    if to_install or decided.to_hold:
        yield _packages.hold(driver_set(plan, after["packages"]) if after else list(decided.held_set))

    if decided.needs_reboot and reboot:
        yield from _rebooted(reboot_timeout)
        problem = _load_problem(plan.version)
        if problem and to_install and decided.previous:
            yield from _put_back(decided, problem, reboot_timeout)
        else:
            yield from _loaded(plan.version, problem)
        return
    if not to_install and not decided.to_hold:
        if decided.needs_reboot:
            host.noop(
                f"NVIDIA driver {plan.version} is installed and held ({plan.method}); loaded module is "
                f"{loaded or 'none'}: reboot required"
            )
        else:
            host.noop(f"NVIDIA driver {plan.version} is installed, held and loaded ({plan.method})")


def decision(
    wanted: DriverSettings, downloaded: Mapping[str, str] | None = None, planned: bool = True
) -> DriverDecision:
    """The driver step's decision on this node for ``wanted`` (its request checked: ``DriverRequestError``
    otherwise), made once per node read (reads facts, changes nothing): ``driver``, ``driver_downloaded``,
    ``driver_changes`` and the deploy's summary share it. ``downloaded``: as for ``driver``. ``planned``:
    False where only the driver's source and state are wanted: then the package index is never read (a
    plan the installed packages do not settle is left undecided, naming the packages in ``index``)."""
    request = requested(wanted)
    facts = node_fact(NvidiaHostState)
    pinned = None if downloaded is None else tuple(sorted(downloaded.items()))
    key = (wanted.source, request, wanted.replace_preinstalled, pinned)
    source, replace = wanted.source, wanted.replace_preinstalled
    found = decided_once("driver", facts, key, lambda: decide_driver(facts, source, request, replace, downloaded))
    if not planned or not found.index:
        return found

    def from_index() -> DriverDecision:  # the installed packages do not settle it: the package index does
        available = host.get_fact(NvidiaAptVersions, packages=list(found.index))
        return decide_driver(facts, source, request, replace, downloaded, available)

    return decided_once("driver planned", facts, key, from_index)


def _driver_request(wanted: DriverSettings) -> None:
    """Refuse arguments no node could take, naming the argument."""
    if wanted.source not in DRIVER_SOURCES:
        raise OperationValueError(f"source must be one of {', '.join(DRIVER_SOURCES)}, got {wanted.source!r}")
    try:
        requested(wanted)
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

    Where the packages replace another driver's, its installed packages are fetched again too where
    their files are not in apt's cache (``--reinstall``), so that a change that does not load after its
    reboot can put that driver back; where apt cannot fetch them, the plan warns and the node goes on.
    Nothing is downloaded where the driver is installed at the planned version, the node keeps its
    own driver, or apt finds every file in ``/var/cache/apt/archives`` already. Where ``driver``
    would fail the node (no package at the version, DKMS refused), or apt cannot install or fetch
    the packages, the node fails here. Pass what was downloaded to ``driver`` as ``downloaded``
    (``downloaded_packages``): it then installs exactly these. A dry run downloads nothing and writes
    nothing under ``/var/cache/apt``: its plan lists the packages and their size.

    **Example:**

    .. code:: python

        driver.driver_downloaded(name="NVIDIA driver 580: downloaded", version="580.126.20", flavor="server-open")
    """
    wanted = DriverSettings(source, branch, version, flavor, allow_dkms, mok_enrolled,
                            replace_preinstalled=replace_preinstalled)  # fmt: skip
    _driver_request(wanted)
    facts = node_fact(NvidiaHostState)
    if not facts["pci"]["gpus"]:
        host.noop("no NVIDIA GPU on this node; no driver to download")
        return
    decided = decision(wanted)
    if decided.error:
        yield _fail(decided.error)
        return
    if decided.plan is None:
        _packages.record({})
        host.noop("the node keeps its own driver: nothing to download")
        return
    if not decided.to_install:
        _packages.record({})
        host.noop(f"NVIDIA driver {decided.plan.version} is installed: nothing to download")
        return
    # planned first: a dry run reads an operation up to its first command only
    again = (
        _packages.kept(f"driver {decided.replaces}'s packages", dict(decided.previous)) if decided.previous else None
    )
    yield from _packages.downloaded(f"NVIDIA driver {decided.plan.version}", dict(decided.to_install))
    if again:
        yield again


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
) -> tuple[list[str], tuple[str, str]]:
    """The disruptive changes ``driver`` would make on this host with the same arguments (reads
    facts, changes nothing): ``driver: install …`` and ``driver: reboot …``; ``[]`` where it would
    only hold packages, change nothing, or fail the host. With them, the driver version the node
    runs now and the one it runs after (``("", "")`` without changes): the turn's hooks get them."""
    wanted = DriverSettings(source, branch, version, flavor, allow_dkms, mok_enrolled, reboot, reboot_timeout,
                            replace_preinstalled)  # fmt: skip
    if source not in DRIVER_SOURCES or not node_fact(NvidiaHostState)["pci"]["gpus"]:
        return [], ("", "")
    try:
        decided = decision(wanted)
    except DriverRequestError:
        return [], ("", "")
    return decided.changes(reboot), decided.versions(reboot)


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
        yield from _loaded(loaded["userspace_version"], _load_problem(loaded["userspace_version"]))
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


def _load_problem(version: str | None) -> str:
    """After a reboot (a run that executes): why driver ``version`` is not loaded or does not match its
    userspace, or ``""``."""
    if not state.is_executing:
        return ""
    now = host.get_fact(NvidiaDriver)
    if not same_driver(now["kernel_module_version"], version) or now["mismatch"]:
        return (
            f"after the reboot the loaded NVIDIA module is {now['kernel_module_version'] or 'none'} "
            f"(userspace {now['userspace_version'] or 'none'}), not {version}"
        )
    return ""


def _loaded(version: str | None, problem: str) -> Generator[Any, Any, None]:
    """After a reboot: fail the host with ``problem`` (``_load_problem``'s), or say driver ``version`` is loaded."""
    if problem:
        yield _fail(problem)
    elif state.is_executing:
        logger.info("%sdriver %s loaded after the reboot", host.print_prefix, version)


def _put_back(decided: DriverDecision, problem: str, timeout: int) -> Generator[Any, Any, None]:
    """Driver ``decided.plan`` installed but did not load (``problem``): put the driver it replaced back from apt's
    cache, reboot into it, and fail the node naming what broke and what it runs now."""
    assert decided.plan is not None
    new, old = decided.plan.version, decided.replaces
    logger.warning("%s%s: putting driver %s back", host.print_prefix, problem, old)
    yield _packages.restore_built(decided.previous, old, new)
    yield from _rebooted(timeout)
    back = _load_problem(old)
    now = "it is loaded" if not back else f"its packages are back, but {back}"
    yield _fail(f"{problem}; driver {old} put back: {now}, its packages held")
