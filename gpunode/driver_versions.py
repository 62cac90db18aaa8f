"""NVIDIA driver version strings: parse, compare, and read them from driver files (no I/O).

Driver versions have two or three numeric parts (``510.54``, ``550.163.01``); the leading
zero of ``01`` is significant in package and file names, so the original text is kept and
comparisons use the numeric tuple.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_VERSION = re.compile(r"^\d+(?:\.\d+){1,2}$")
_BRANCH = re.compile(r"^\d{3}$")
_PROC = re.compile(
    r"^NVRM version:\s+NVIDIA UNIX\s+"
    r"(?:(?P<open>Open Kernel Module for (?P<arch1>\S+))|(?P<arch2>\S+) Kernel Module)\s+"
    r"(?P<ver>\d+(?:\.\d+)+)\b",
    re.M,
)
_SONAME_VERSION = re.compile(r"libnvidia-ml\.so\.(\d+(?:\.\d+)+)$")


def is_driver_version(text: str) -> bool:
    """True for a full driver version with two or three numeric parts (``550.163.01``)."""
    return bool(_VERSION.match(text))


def is_branch(text: str) -> bool:
    """True for a driver branch: three digits (``580``)."""
    return bool(_BRANCH.match(text))


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key of a driver version; raise ``ValueError`` naming a bad value."""
    if not is_driver_version(version):
        raise ValueError(f"not an NVIDIA driver version: {version!r} (expected e.g. 550.163.01 or 510.54)")
    return tuple(int(part) for part in version.split("."))


def branch_of(version: str) -> str:
    """The branch (first part) of a driver version: ``550.163.01`` -> ``550``."""
    version_key(version)
    return version.split(".", 1)[0]


def same_driver(a: str | None, b: str | None) -> bool:
    """True when two versions name the same driver build.

    A shorter version matches a longer one by numeric prefix, because ``nvidia-smi`` prints
    ``NVML library version: 535.161`` for ``535.161.07``.
    """
    if not a or not b or not is_driver_version(a) or not is_driver_version(b):
        return False
    ka, kb = version_key(a), version_key(b)
    n = min(len(ka), len(kb))
    return ka[:n] == kb[:n]


def parse_proc_version(text: str) -> tuple[str, str] | None:
    """Parse ``/proc/driver/nvidia/version``: ``(version, "open" | "proprietary")`` or None.

    Handles the proprietary layout (``x86_64 Kernel Module  550.163.01``) and the open one
    (``Open Kernel Module for x86_64  565.57.01  Release Build``), with or without a date.
    """
    match = _PROC.search(text)
    if not match:
        return None
    return match.group("ver"), "open" if match.group("open") else "proprietary"


def version_from_library(path: str) -> str | None:
    """The driver version in a resolved ``libnvidia-ml.so.<version>`` path, else None."""
    match = _SONAME_VERSION.search(path.strip())
    return match.group(1) if match else None


def upstream_version(debian_version: str) -> str:
    """The upstream part of a Debian package version: ``580.126.20-0ubuntu0.24.04.2`` -> ``580.126.20``."""
    text = debian_version.split(":", 1)[-1]
    return text.rsplit("-", 1)[0] if "-" in text else text


def mixed_userspace(packages: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the installed NVIDIA userspace libraries (``libnvidia-*`` but the container toolkit's, ``libcuda*``;
    ``packages``: name -> its ``version``) are not of one driver version, or None. A library of another
    driver than the rest fails whatever loads both (CUDA beside NVML, an X/EGL stack beside compute)."""
    versions: dict[str, list[str]] = {}
    for name, found in sorted(packages.items()):
        if not (name.startswith("libcuda") or name.startswith("libnvidia-")) or name.startswith("libnvidia-container"):
            continue
        upstream = upstream_version(str(found.get("version", "")))
        if is_driver_version(upstream) and len(upstream.split(".")[0]) == 3:  # not a CUDA library's 12.4.127
            versions.setdefault(upstream, []).append(name)
    if len(versions) < 2:
        return None
    shown = "; ".join(
        f"{version}: {', '.join(names[:3])}{', …' if len(names) > 3 else ''}"
        for version, names in sorted(versions.items(), key=lambda item: version_key(item[0]))
    )
    return (
        f"the NVIDIA userspace libraries are of {len(versions)} driver versions ({shown}): a program that loads "
        "two of them fails; install one driver's whole set and hold it"
    )
