"""Where the NVIDIA Container Toolkit comes from, and which repository version to pin (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOOLKIT_SOURCES = ("auto", "repository", "deb_dir", "installed")
_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:-\d+)?\Z")


class ToolkitRequestError(ValueError):
    """The requested toolkit is invalid whatever the host; the message names the argument."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument  # ``source``, ``version`` or ``deb_dir``


def check_toolkit(source: str, version: str | None, deb_dir: str | None) -> str | None:
    """Validate the arguments; return the package version to pin (``1.17.8`` means ``1.17.8-1``)."""
    if source not in TOOLKIT_SOURCES:
        raise ToolkitRequestError("source", f"source must be one of {', '.join(TOOLKIT_SOURCES)}, got {source!r}")
    if version is not None and not _VERSION.match(version):
        raise ToolkitRequestError(
            "version", f"version must be a toolkit package version like 1.17.8-1, got {version!r}"
        )
    if source == "deb_dir" and (not deb_dir or not deb_dir.startswith("/")):
        raise ToolkitRequestError("deb_dir", f"deb_dir must be an absolute directory on the node, got {deb_dir!r}")
    return f"{version}-1" if version is not None and "-" not in version else version


def toolkit_source(source: str, version: str | None, packaged: Mapping[str, str], found_outside: bool) -> str:
    """The source ``auto`` stands for on this node; other sources stand for themselves.

    ``packaged``: the toolkit's packages installed (all of them, name -> version), else empty;
    ``found_outside``: ``nvidia-ctk`` and ``nvidia-container-runtime`` are on PATH without them.
    ``auto`` is ``installed`` when the toolkit is present (and, from packages, at ``version``
    when one is asked for), else ``repository``.
    """
    if source != "auto":
        return source
    if packaged:
        return "installed" if version is None or set(packaged.values()) == {version} else "repository"
    return "installed" if found_outside else "repository"


def toolkit_install(
    source: str, version: str | None, packages: Mapping[str, str], found_outside: bool, names: Sequence[str]
) -> str | None:
    """The version an install or upgrade of the toolkit's packages ``names`` puts on the node (``""``: the
    newest the repository offers, read then), or None where ``container_toolkit`` installs nothing.

    ``packages``: the installed ones, name -> version; ``version``: as ``check_toolkit`` returns it.
    A complete set at one version is kept when no version is asked for.
    """
    complete = all(name in packages for name in names)
    if toolkit_source(source, version, packages if complete else {}, found_outside) == "installed":
        return None
    if version is None and complete and len({packages[name] for name in names}) == 1:
        version = packages[names[0]]
    if complete and all(packages[name] == version for name in names):
        return None
    return version or ""


def keyring_needs_pin(source: str, repository_configured: bool, fingerprints: Sequence[str], pinned: str) -> bool:
    """Whether the repository keyring holds a key besides exactly ``pinned`` and must be rewritten.

    Checked wherever apt may read the repository: the toolkit comes from it (``source`` is
    ``repository``) or its list file is on the node (``repository_configured``), whatever the
    source, an installed toolkit included: any key in that keyring may sign the packages apt
    upgrades the toolkit to. ``fingerprints``: the keyring's primary keys (none: no keyring).
    """
    if source != "repository" and not repository_configured:
        return False
    return list(fingerprints) not in ([], [pinned])


def newest_common_version(available: Mapping[str, Sequence[str]], names: Sequence[str]) -> str | None:
    """The newest version the index offers for every one of ``names`` (each list newest first)."""
    if not names:
        return None
    for candidate in available.get(names[0], ()):
        if all(candidate in available.get(name, ()) for name in names[1:]):
            return candidate
    return None


@dataclass(frozen=True)
class ToolkitDecision:
    """What the toolkit step does on one node (see :func:`decide_toolkit`)."""

    source: str  # what the source stands for here: ``repository``, ``deb_dir`` or ``installed`` (only checked)
    install: str | None  # the version installed (``""``: the newest the repository offers, read then); None: none
    held: bool  # every package of the toolkit is held
    keyring_wrong: bool  # the repository keyring holds another key than the pinned one: rewritten first
    installed: str | None  # the version of the toolkit's main package on the node, if any


def decide_toolkit(
    toolkit: Mapping[str, Any], source: str, version: str | None, names: Sequence[str], fingerprint: str
) -> ToolkitDecision:
    """The toolkit step's decision on a node (``toolkit``: ``NvidiaContainerToolkit``'s value; ``version`` as
    ``check_toolkit`` returns it; ``names``: the toolkit's packages, main package first; ``fingerprint``: the
    pinned repository key's)."""
    packages = toolkit["packages"]
    complete = all(name in packages for name in names)
    found_outside = bool(toolkit.get("ctk_path") and toolkit["runtime_binary"])
    chosen = toolkit_source(source, version, packages if complete else {}, found_outside)
    return ToolkitDecision(
        source=chosen,
        install=toolkit_install(source, version, packages, found_outside, names),
        held=all(name in toolkit["held"] for name in names),
        keyring_wrong=keyring_needs_pin(
            chosen, toolkit["repo_list"] is not None, toolkit["keyring_fingerprints"], fingerprint
        ),
        installed=packages.get(names[0]),
    )


CDI_OWNERS = ("auto", "project", "refresh")
REFRESH_SPEC = "/var/run/cdi/nvidia.yaml"  # where nvidia-cdi-refresh.service writes the spec
# A refresh at boot may run before the driver is ready and be started again by its .path unit; without
# a start limit it is never left failed for it (toolkit 1.20 allows 5 starts in 10 s).
REFRESH_DROPIN_TEXT = (
    "# Written by pyinfra-gpunode: the CDI refresh may be started any number of times.\n"
    "[Unit]\n"
    "StartLimitIntervalSec=0\n"
)


def cdi_owner(setting: str, refresh_installed: bool, driver_container: bool = False) -> tuple[str, str]:
    """``(owner, error)``: who writes the node's NVIDIA CDI spec, ``project`` or ``refresh`` (the toolkit's
    ``nvidia-cdi-refresh.service``); ``auto`` is ``refresh`` where its unit is installed, unless the driver
    comes from the GPU Operator's driver container (``driver_container``): the unit looks for the driver
    on the host (nvidia-smi in /usr/bin or /usr/sbin, nvidia.ko in the kernel's modules.dep) and is
    skipped there, so the project generates the spec from the container's root. ``error`` names why the
    setting cannot hold on this node (empty when it can)."""
    if setting not in CDI_OWNERS:
        return "project", f"CDI spec owner must be one of {', '.join(CDI_OWNERS)}, got {setting!r}"
    if setting == "refresh" and not refresh_installed:
        return "refresh", (
            "CDI spec owner is refresh, but nvidia-cdi-refresh.service is not installed "
            "(NVIDIA Container Toolkit 1.18 or later installs it)"
        )
    if setting == "refresh" and driver_container:
        return "refresh", (
            "CDI spec owner is refresh, but the driver comes from the GPU Operator's driver container "
            "(/run/nvidia/driver): nvidia-cdi-refresh.service looks for the driver on the host (nvidia-smi, "
            "nvidia.ko in the kernel's modules.dep) and is skipped; set gpunode_cdi_owner: auto or project"
        )
    if setting == "auto":
        return ("refresh" if refresh_installed and not driver_container else "project"), ""
    return setting, ""
