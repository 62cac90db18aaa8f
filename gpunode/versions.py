"""Parse the version strings that node tools print (no I/O)."""

from __future__ import annotations

import re
from typing import TypedDict

_CONTAINERD = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?")


class ContainerdVersionInfo(TypedDict):
    major: int
    minor: int
    patch: int
    raw: str
    build: str


def parse_containerd_version(line: str) -> ContainerdVersionInfo | None:
    """Parse ``containerd --version`` output.

    Forms: ``containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1`` (Debian),
    ``containerd github.com/containerd/containerd/v2 v2.1.1 <sha>`` (upstream) and
    ``containerd containerd.io 1.7.27 <sha>`` (Docker's package). ``build`` is the second field.
    """
    fields = line.split()
    if len(fields) < 3 or fields[0] != "containerd":
        return None
    match = _CONTAINERD.match(fields[2])
    if not match:
        return None
    return {
        "major": int(match["major"]),
        "minor": int(match["minor"]),
        "patch": int(match["patch"] or 0),
        "raw": fields[2],
        "build": fields[1],
    }
