"""Fetch Debian's containerd packages with a private apt configuration.

The system's apt setup is left untouched: lists, cache and sources live under the cache
directory (``$GPUNODE_CACHE``, default ``/var/cache/pyinfra-gpunode``). The archive URI is the
one this machine's apt already uses, read at run time.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

from tests.fleet.archive import debian_mirror

PACKAGES = {
    "1.6.20": ("bookworm", "1.6.20~ds1-1+deb12u3"),
    "1.7.24": ("trixie", "1.7.24~ds1-6+deb13u1"),
    "2.1.9": ("sid", "2.1.9+ds1-5"),
}
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def cache_dir() -> Path:
    return Path(os.environ.get("GPUNODE_CACHE", "/var/cache/pyinfra-gpunode"))


def _apt_options(scratch: Path) -> list[str]:
    return [
        f"-oDir::Etc::SourceList={scratch / 'sources.list'}",
        "-oDir::Etc::SourceParts=-",
        f"-oDir::State::Lists={scratch / 'lists'}",
        f"-oDir::Cache={scratch / 'cache'}",
        "-oAPT::Sandbox::User=root",
        "-qq",
    ]


def containerd_binary(version: str) -> Path:
    """Path of ``/usr/bin/containerd`` from Debian's package of ``version``, unpacked on demand; for a
    version Debian does not ship (2.3, 2.4), the one built from upstream source (``tests.realbin.upstream``)."""
    if version not in PACKAGES:
        from tests.realbin import upstream

        return upstream.containerd_binary(version)
    deb_version = PACKAGES[version][1]
    root = cache_dir() / "containerd"
    unpacked = root / "bin" / version
    binary = unpacked / "usr" / "bin" / "containerd"
    if binary.exists():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        scratch = root / "apt"
        for sub in ("lists/partial", "cache/archives/partial", "debs"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        mirror = debian_mirror()
        (scratch / "sources.list").write_text(
            "".join(f"deb [signed-by={KEYRING}] {mirror} {s} main\n" for s, _ in PACKAGES.values())
        )
        opts = _apt_options(scratch)
        debs = scratch / "debs"
        if not list(debs.glob(f"containerd_{deb_version.replace('+', '*')}_*.deb")):
            subprocess.run(["apt-get", *opts, "update"], check=True)
            subprocess.run(["apt-get", *opts, "download", f"containerd={deb_version}"], check=True, cwd=debs)
        (deb,) = debs.glob(f"containerd_{deb_version.replace('+', '*')}_*.deb")
        tmp = unpacked.with_name(f".{version}.tmp")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
        tmp.rename(unpacked)
    return binary
