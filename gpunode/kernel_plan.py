"""Which kernel packages to hold so that no newer kernel arrives behind the driver's back (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable

# linux-* packages that never pull a kernel in.
_NOT_KERNEL = (
    "linux-base",
    "linux-libc-dev",
    "linux-firmware",
    "linux-doc",
    "linux-sysctl-defaults",
    "linux-tools-",
    "linux-cloud-tools-",
    "linux-source",
    "linux-perf",
    "linux-compiler-",
    "linux-kbuild-",
    "linux-initramfs-tool",
    "linux-sound-base",
)


def _versioned(rest: str) -> bool:
    return rest[:1].isdigit()


def kernel_packages(release: str, installed: Iterable[str]) -> list[str]:
    """Installed packages to hold for kernel ``release`` (as ``uname -r`` prints it).

    The release's own image, modules, headers and NVIDIA module packages, and the meta
    packages that would pull a newer kernel ABI (``linux-image-amd64``, ``linux-generic``,
    ``linux-modules-nvidia-580-server-generic``…). Other kernels' packages are left alone.
    """
    names = sorted(set(installed))
    metas_image = {n[len("linux-image-") :] for n in names if n.startswith("linux-image-")}
    hold: set[str] = set()
    for name in names:
        if not name.startswith("linux-") or name.startswith(_NOT_KERNEL):
            continue
        if name.endswith(f"-{release}") or name.endswith(f"-{release}-unsigned") or f"-{release}-" in name:
            hold.add(name)
            continue
        for prefix in ("linux-headers-",):
            if name.startswith(prefix):
                rest = name[len(prefix) :].removesuffix("-common")
                if _versioned(rest) and release.startswith(rest + "-"):
                    hold.add(name)  # Ubuntu linux-headers-5.15.0-91, Debian linux-headers-6.12.117+deb13-common
        for prefix in ("linux-image-", "linux-headers-"):
            if name.startswith(prefix) and not _versioned(name[len(prefix) :]):
                hold.add(name)  # linux-image-amd64, linux-headers-generic-hwe-22.04
        if name.startswith("linux-modules-nvidia-"):
            # linux-modules-nvidia-<F>-<flavour> is a meta unless it names a kernel release
            tail = name[len("linux-modules-nvidia-") :].split("-")[1:]
            if not any(part[:1].isdigit() and "." in part for part in tail):
                hold.add(name)
        if name.startswith("linux-") and name[len("linux-") :] in metas_image:
            hold.add(name)  # linux-generic next to linux-image-generic
    return sorted(hold)
