"""Where the fleet keeps its cache (roots, .deb files, key) and the state of running hosts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("GPUNODE_CACHE", "/var/cache/pyinfra-gpunode"))


def roots_dir() -> Path:
    return cache_dir() / "roots"


def debs_dir(root_name: str) -> Path:
    return cache_dir() / "debs" / root_name


def key_path() -> Path:
    """Private key the harness logs in with; its public half goes into every host."""
    return cache_dir() / "fleet-key" / "id_ed25519"


def fleet_dir(fleet_name: str) -> Path:
    return cache_dir() / "fleets" / fleet_name
