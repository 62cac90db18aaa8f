"""Keep the node on its kernel (package holds) and keep nouveau (and nova_core) away from NVIDIA GPUs."""

from __future__ import annotations

import posixpath
from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from pyinfra_gpunode.facts.kernel import NOUVEAU_CONF, KernelState, NouveauBlacklist, initramfs_stamp
from pyinfra_gpunode.kernel_plan import kernel_packages
from pyinfra_gpunode.operations._atomic import fail as _fail
from pyinfra_gpunode.operations._atomic import write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.settings import KERNEL_HOLD

NOUVEAU_TEXT = (
    "# Managed by pyinfra-gpunode: the NVIDIA driver owns the GPUs on this node.\n"
    "blacklist nouveau\n"
    "options nouveau modeset=0\n"
)
# Linux 6.15 and later ship nova_core (drivers/gpu/nova-core/Kconfig: "the Nova Core driver for Nvidia GPUs
# based on the GPU System Processor (GSP)... Turing and later"), which would claim them before nvidia does.
NOVA_CORE_LINE = "blacklist nova_core\n"


def blacklist_text(nova_core: bool) -> str:
    """The blacklist file's text: nouveau's, and nova_core's where a kernel of the node ships it (a node
    without it keeps the text it has had)."""
    return NOUVEAU_TEXT + (NOVA_CORE_LINE if nova_core else "")


# Nodes without initramfs tooling (containers) have no initramfs that could load nouveau.
REGENERATE_INITRAMFS = (
    "if command -v update-initramfs >/dev/null; then update-initramfs -u -k all; "
    "elif command -v dracut >/dev/null; then dracut --force --regenerate-all; fi"
)
REBOOT_REQUIRED = (
    "touch /var/run/reboot-required && "
    "(grep -qx gpunode-nouveau /var/run/reboot-required.pkgs 2>/dev/null || "
    "echo gpunode-nouveau >> /var/run/reboot-required.pkgs)"
)


@operation()
@locked_before_changes
def held(release: str | None = None, present: bool = KERNEL_HOLD) -> Generator[Any, Any, None]:
    """
    Hold the kernel's packages so no newer kernel is installed behind the driver's back.

    + release: kernel release to hold, as ``uname -r`` prints it; default the running kernel
    + present: ``False`` removes exactly these holds again, for a planned kernel upgrade

    Holds the release's image, modules, headers and NVIDIA module packages, and the meta
    packages that would pull a newer kernel (``linux-image-amd64``, ``linux-generic``,
    ``linux-modules-nvidia-<flavour>-generic``…).

    **Example:**

    .. code:: python

        kernel.held(name="Hold the running kernel")
        kernel.held(name="Release the kernel for the upgrade window", present=False)
    """
    if release is not None and (not release or "/" in release or release.startswith("-")):
        raise OperationValueError(f"release must be a kernel release like 6.12.117+deb13-amd64, got {release!r}")

    state = node_fact(KernelState)
    target = release or state["running"]
    packages = kernel_packages(target or "", state["packages"])
    held_now = set(state["held"])
    if present:
        if not packages and release:
            yield _fail(f"no installed packages belong to kernel {target}; nothing to hold")
            return
        if not packages:
            # A container shares its machine's kernel, and a hand-built kernel has no package.
            host.noop(f"the running kernel {target} comes from no installed package; nothing to hold")
            return
        missing = [name for name in packages if name not in held_now]
        if not missing:
            host.noop(f"kernel {target} is held")
            return
        yield StringCommand("apt-mark", "hold", *[QuoteString(name) for name in missing])
    else:
        to_release = [name for name in packages if name in held_now]
        if not to_release:
            host.noop(f"kernel {target} is not held")
            return
        yield StringCommand("apt-mark", "unhold", *[QuoteString(name) for name in to_release])


@operation()
@locked_before_changes
def nouveau_blacklisted(path: str = NOUVEAU_CONF) -> Generator[Any, Any, None]:
    """
    Blacklist the nouveau driver (and ``nova_core``, where an installed kernel ships it: Linux 6.15
    and later) and regenerate the initramfs (``update-initramfs`` or ``dracut``, where installed)
    until it was built with this blacklist.

    + path: modprobe.d file that carries the blacklist

    A successful regeneration is recorded as a copy of the blacklist in
    ``/var/lib/pyinfra-gpunode/initramfs/``; when the regeneration failed (or never ran) the
    next run regenerates again, even though the blacklist file already matches. When nouveau
    is still loaded, a reboot is needed: the operation reports it in
    ``/var/run/reboot-required`` (as Debian and Ubuntu packages do) and in its noop message.

    **Example:**

    .. code:: python

        kernel.nouveau_blacklisted(name="Keep nouveau off the GPUs")
    """
    if not path.startswith("/etc/modprobe.d/") or not path.endswith(".conf") or "\n" in path:
        raise OperationValueError(f"path must be a .conf file in /etc/modprobe.d/, got {path!r}")

    state = node_fact(NouveauBlacklist, path=path)
    nova = state["nova_core_shipped"] or state["nova_core_loaded"] or NOVA_CORE_LINE in (state["content"] or "")
    text = blacklist_text(nova)
    what = "nouveau and nova_core are" if nova else "nouveau is"
    loaded = state["loaded"] or state["nova_core_loaded"]
    if state["content"] == text and state["initramfs"] == text:
        if loaded:
            still = "one of them is" if nova else "it is"
            host.noop(f"{what} blacklisted; {still} still loaded until the node reboots (reboot required)")
        else:
            host.noop(f"{what} blacklisted")
        return
    if state["content"] != text:
        yield from write_file(path, text)
    stamp = initramfs_stamp(path)
    # The stamp is written only after a successful regeneration: a failed one is retried next run.
    yield StringCommand(
        REGENERATE_INITRAMFS, "&&", "mkdir", "-p", QuoteString(posixpath.dirname(stamp)),
        "&&", "cp", QuoteString(path), QuoteString(f"{stamp}.gpunode-new"),
        "&&", "mv", "-f", QuoteString(f"{stamp}.gpunode-new"), QuoteString(stamp),
    )  # fmt: skip
    if loaded:
        yield StringCommand(REBOOT_REQUIRED)
