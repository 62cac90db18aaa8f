"""Whether the NVIDIA module DKMS built for a kernel will load there: its version, the kernel it was built
for (vermagic) and, under Secure Boot, its signature (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .driver_versions import same_driver
from .log import shown

DKMS_KEY = "/var/lib/dkms/mok.pub"  # the certificate DKMS signs modules with (Debian, Ubuntu)


@dataclass(frozen=True)
class BuiltModule:
    """The nvidia module ``modinfo`` finds for one kernel (``NvidiaHostState``'s ``built_module_*`` or
    ``boot_module_*``)."""

    kernel: str
    version: str | None
    vermagic: str | None
    signer: str | None  # "name (key id)"; None where the module is unsigned
    next_boot: bool  # the kernel the node boots next, where the running one is another


def built_modules(node: Mapping[str, Any]) -> dict[str, BuiltModule]:
    """The running kernel's and the next boot kernel's module, by kernel (one entry where they are one)."""
    running = str(node.get("kernel") or "")
    kernels = {running: ("built", False)}
    boot = node.get("boot_kernel")
    if boot and boot != running:
        kernels[boot] = ("boot", True)
    return {
        kernel: BuiltModule(
            kernel,
            node.get(f"{prefix}_module_version"),
            node.get(f"{prefix}_module_vermagic"),
            node.get(f"{prefix}_module_signer"),
            next_boot,
        )
        for kernel, (prefix, next_boot) in kernels.items()
    }


def module_problem(module: BuiltModule, version: str, secure_boot: bool | None) -> str:
    """Why ``module`` will not load the driver ``version`` on its kernel, or ``""``. ``secure_boot``: the node's
    state (None: unknown, taken as on): an unsigned module is refused there."""
    kernel = module.kernel
    next_boot = ", the kernel this node boots next" if module.next_boot else ""
    if not same_driver(module.version, version):
        found = f"version {shown(module.version, 40)}" if module.version else "none"
        return (
            f"NVIDIA driver {version} is installed but DKMS built no nvidia {version} module for kernel {kernel}"
            f"{next_boot} (`modinfo -k {kernel} nvidia` finds {found}; see `dkms status` and "
            "/var/lib/dkms/*/*/build/make.log on the node)"
        )
    built_for = (module.vermagic or "").split(" ", 1)[0]
    if built_for != kernel:
        release = shown(built_for, 80) if built_for else "unknown"
        vermagic = shown(module.vermagic, 120) if module.vermagic else "none"
        return (
            f"the nvidia {version} module for kernel {kernel}{next_boot and next_boot + ','} was built for kernel "
            f"{release} (its "
            f"vermagic: {vermagic}): the kernel refuses it"
        )
    if secure_boot is not False and not module.signer:
        state = "on" if secure_boot else "unknown (taken as on)"
        return (
            f"the nvidia {version} module DKMS built for kernel {kernel}{next_boot and next_boot + ','} is not signed, "
            "and Secure Boot "
            f"is {state}: the kernel refuses it. DKMS signs with /var/lib/dkms/mok.key and {DKMS_KEY}, and makes "
            "them only where openssl is installed; enroll the certificate with `mokutil --import "
            f"{DKMS_KEY}`, then reinstall the module package"
        )
    return ""
