"""The Debian archive this machine's apt uses, read at run time: the only place hosts may reach."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit


def debian_mirror() -> str:
    """The Debian archive URI of this machine's apt sources (deb822 or one-line format)."""
    candidates: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        candidates += re.findall(r"^URIs:\s*(\S+)", path.read_text(), re.M)
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.exists():
        candidates += re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", sources_list.read_text(), re.M)
    for uri in candidates:
        if uri.startswith("http://") and uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    raise RuntimeError("no http:// Debian archive found in this machine's apt sources")


def archive_host() -> str:
    host = urlsplit(debian_mirror()).hostname
    assert host, "archive URI without a host name"
    return host
