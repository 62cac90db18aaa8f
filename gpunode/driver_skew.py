"""A driver that works now but is out of step: named before it bites (no I/O).

The nvidia module after the next reboot: a node mid-upgrade runs one kernel and boots another next (its
``/vmlinuz`` link names it). DKMS builds for the kernels whose headers are installed; a module built only
for the running kernel works until the reboot, when no nvidia module loads and the node serves no GPU.
A module the kernel will refuse at that boot: built for another kernel, or unsigned under Secure Boot
(``built_module``). And the userspace libraries of two driver versions (``driver_versions.mixed_userspace``).
All are said in the readiness report's warnings and in the deploy's plan.
"""

from __future__ import annotations

from typing import Any

from pyinfra_gpunode.built_module import built_modules, module_problem
from pyinfra_gpunode.driver_versions import mixed_userspace, same_driver
from pyinfra_gpunode.log import without_controls


def module_warning(
    running: str | None,
    boot: str | None,
    module_built: bool,
    boot_module_built: bool,
    boot_version: str | None,
    userspace: str | None,
) -> str | None:
    """Why the nvidia module may not load once the node boots ``boot`` (it runs ``running``), or None: no
    other kernel is next, or no module is built for the running kernel either (that is said elsewhere)."""
    if not boot or not running or boot == running or not module_built:
        return None
    boot, running = without_controls(boot), without_controls(running)
    if not boot_module_built:
        return (
            f"the nvidia module is built for the running kernel {running} but not for {boot}, the kernel this node "
            f"boots next: after a reboot no nvidia module loads (build it for {boot}: `dkms autoinstall -k {boot}` "
            "with its linux-headers installed, or install the driver's precompiled module package for it)"
        )
    if boot_version and userspace and not same_driver(boot_version, userspace):
        return (
            f"the nvidia module built for {boot}, the kernel this node boots next, is {without_controls(boot_version)} "
            f"but the userspace library is {without_controls(userspace)}: after a reboot NVML fails with a "
            "driver/library version mismatch"
        )
    return None


def refused_at_boot(host: Any) -> str | None:
    """Why the kernel will refuse the nvidia module the node loads after its next reboot (the module built for
    the kernel it boots next, or the running one), or None: built for another kernel (its vermagic), or
    unsigned where Secure Boot is on (``built_module.module_problem``). Nothing where the module or its
    vermagic is unknown, or Secure Boot only unknown: a preinstalled driver is not second-guessed."""
    modules = built_modules(host)
    module = modules.get(host.get("boot_kernel") or "") or modules.get(host.get("kernel") or "")
    if module is None or not module.version or not module.vermagic:
        return None
    problem = module_problem(module, module.version, secure_boot=host.get("secure_boot") is True)
    return f"after a reboot: {problem}" if problem else None


def skew_warnings(host: Any) -> list[tuple[str, str]]:
    """``(what, warning)`` for each way the driver of ``host`` (``NvidiaHostState``'s value) is out of step:
    ``next boot`` (``module_warning``, ``refused_at_boot``) and ``userspace`` (``mixed_userspace``)."""
    found = [
        ("next boot", module_warning(
            host["kernel"], host.get("boot_kernel"), host["module_built"], host.get("boot_module_built", False),
            host.get("boot_module_version"), host["driver"]["userspace_version"],
        ) or refused_at_boot(host)),
        ("userspace", mixed_userspace(host["packages"])),
    ]  # fmt: skip
    return [(what, without_controls(warning)) for what, warning in found if warning]  # names read from the node
