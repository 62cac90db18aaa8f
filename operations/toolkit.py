"""Install and hold the NVIDIA Container Toolkit pinned to one version, or check it."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import OperationValueError, StringCommand, operation

from pyinfra_gpunode import shell
from pyinfra_gpunode.driver_versions import upstream_version
from pyinfra_gpunode.facts.package_index import AptDownloads, NvidiaAptVersions
from pyinfra_gpunode.facts.toolkit import (
    TOOLKIT_KEYRING,
    TOOLKIT_LIST,
    TOOLKIT_PACKAGES,
    NvidiaContainerToolkit,
    ToolkitInfo,
)
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import _packages
from pyinfra_gpunode.operations._atomic import fail as _fail
from pyinfra_gpunode.operations._atomic import write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import decided_once, node_fact
from pyinfra_gpunode.settings import TOOLKIT_SOURCE
from pyinfra_gpunode.toolkit_plan import (
    ToolkitDecision,
    ToolkitRequestError,
    check_toolkit,
    decide_toolkit,
    newest_common_version,
)

TOOLKIT_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
TOOLKIT_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
TOOLKIT_REPO_LINE = (
    f"deb [signed-by={TOOLKIT_KEYRING}] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
)


@operation()
@locked_before_changes
def container_toolkit(
    source: str = TOOLKIT_SOURCE,
    version: str | None = None,
    deb_dir: str | None = None,
    downloaded: dict[str, str] | None = None,
) -> Generator[Any, Any, None]:
    """
    Install the NVIDIA Container Toolkit pinned to one version and held, or check it.

    + source: ``repository`` (NVIDIA's apt repository; its key is accepted only with the
      pinned fingerprint ``C95B321B…F796ECB0``), ``deb_dir`` (``.deb`` files already on the
      node, for air-gapped sites), ``installed`` (only check what is there: its four packages,
      or ``nvidia-ctk`` and ``nvidia-container-runtime`` on PATH outside the package manager)
      or ``auto`` (``installed`` when the toolkit is there, else ``repository``)
    + version: toolkit package version (``1.17.8-1``), the same for all four packages; without
      it ``repository`` installs the newest version the repository offers once, then keeps it
    + deb_dir: directory on the node holding the four ``.deb`` files (``source="deb_dir"``)
    + downloaded: the packages ``container_toolkit_downloaded`` put in apt's cache before (name ->
      exact version, as ``downloaded_packages`` returns them): from the repository, the version
      downloaded is installed from apt's cache, with no ``apt-get update`` and no download (apt
      fails rather than fetch); ``None``: the repository is read and the packages downloaded here

    **Example:**

    .. code:: python

        toolkit.container_toolkit(name="NVIDIA Container Toolkit", version="1.17.8-1")
        toolkit.container_toolkit(name="Toolkit from a local mirror", source="deb_dir",
                                  version="1.17.8-1", deb_dir="/srv/debs/nvidia")
    """
    try:
        version = check_toolkit(source, version, deb_dir)
    except ToolkitRequestError as exc:
        raise OperationValueError(str(exc)) from exc

    toolkit = node_fact(NvidiaContainerToolkit)
    decided = decision(source, version)
    # A keyring with any key but exactly the pinned one lets that key sign the repository: replaced,
    # on every run where apt reads the repository (its list file is there), the toolkit installed or not.
    if decided.keyring_wrong:
        yield StringCommand(keyring_script())
    if decided.source == "installed":
        yield from _toolkit_checked(toolkit, version, quiet=decided.keyring_wrong)
        return
    if decided.install is None and decided.held and toolkit["runtime_binary"]:
        if not decided.keyring_wrong:
            host.noop(f"NVIDIA Container Toolkit {decided.installed} is installed and held")
        return

    target = decided.install
    if target is not None and decided.source == "repository" and downloaded is not None:
        target = target or _toolkit_version(downloaded)
        if target is None:
            yield _fail("NVIDIA Container Toolkit: no version of it was downloaded before the turn")
            return
        yield _packages.install(dict.fromkeys(TOOLKIT_PACKAGES, target), download=False)
    elif target is not None and decided.source == "repository":
        target = yield from _from_repository(toolkit, target)
        if target is None:
            return
        yield _packages.install(dict.fromkeys(TOOLKIT_PACKAGES, target))
    elif target is not None:
        assert deb_dir is not None
        yield _install_debs(deb_dir, target or None)
    yield _packages.hold(list(TOOLKIT_PACKAGES))


def decision(source: str, version: str | None) -> ToolkitDecision:
    """The toolkit step's decision on this node (``version`` as ``check_toolkit`` returns it), made once per
    node read (reads facts, changes nothing): ``container_toolkit``, ``container_toolkit_downloaded`` and
    ``toolkit_changes`` share it."""
    toolkit = node_fact(NvidiaContainerToolkit)
    return decided_once(
        "toolkit",
        toolkit,
        (source, version),
        lambda: decide_toolkit(toolkit, source, version, TOOLKIT_PACKAGES, TOOLKIT_FINGERPRINT),
    )


def _toolkit_version(downloaded: Mapping[str, str]) -> str | None:
    """The one version all four toolkit packages were downloaded at, or None."""
    versions = {downloaded.get(name) for name in TOOLKIT_PACKAGES}
    return versions.pop() if len(versions) == 1 else None


@operation()
@locked_before_changes
def container_toolkit_downloaded(
    source: str = TOOLKIT_SOURCE, version: str | None = None, deb_dir: str | None = None
) -> Generator[Any, Any, None]:
    """
    Download the NVIDIA Container Toolkit packages ``container_toolkit`` would install into apt's cache
    (``apt-get install --download-only``), so that the install needs no network: on every node at
    once, before the rollout's turns, while the nodes still serve.

    + source: ``repository``, ``deb_dir``, ``installed`` or ``auto``, as for ``container_toolkit``
    + version: toolkit package version (``1.17.8-1``); without it the newest the repository offers
    + deb_dir: directory on the node holding the ``.deb`` files (``source="deb_dir"``): nothing to download

    From NVIDIA's repository it first does what the install would do there: the keyring with the
    pinned key, the list file, ``apt-get update``, and without a version the choice of the newest
    version the repository offers, so the install takes exactly what was downloaded (pass it as
    ``downloaded``, from ``downloaded_packages``). A keyring holding another key is pinned here too.
    Nothing is downloaded where the toolkit is installed at the version, is only checked
    (``installed``), comes from ``deb_dir`` (files already on the node), or apt finds the files in
    ``/var/cache/apt/archives`` with the repository already read. A dry run changes nothing.

    **Example:**

    .. code:: python

        toolkit.container_toolkit_downloaded(name="NVIDIA Container Toolkit: downloaded", version="1.17.8-1")
    """
    try:
        version = check_toolkit(source, version, deb_dir)
    except ToolkitRequestError as exc:
        raise OperationValueError(str(exc)) from exc
    toolkit = node_fact(NvidiaContainerToolkit)
    decided = decision(source, version)
    keyring_wrong = decided.keyring_wrong
    if keyring_wrong:
        yield StringCommand(keyring_script())
    target = decided.install
    if target is None or decided.source != "repository":
        _packages.record({})
        if not keyring_wrong:
            where = "its .deb files are on the node (deb_dir)" if target is not None else "it is installed"
            host.noop(f"NVIDIA Container Toolkit: {where}; nothing to download")
        return
    configured = bool(toolkit["keyring_fingerprints"]) and toolkit["repo_list"] == TOOLKIT_REPO_LINE
    if target and configured and not keyring_wrong:  # the index read before may offer the version already
        pins = dict.fromkeys(TOOLKIT_PACKAGES, target)
        needed = host.get_fact(AptDownloads, packages=_packages.pins_of(pins))
        if not needed["error"]:
            yield from _packages.downloaded(f"NVIDIA Container Toolkit {target}", pins, needed)
            return
    if not state.is_executing:
        logger.info("%splan: download before the turns: NVIDIA Container Toolkit %s from NVIDIA's repository "
                    "(keyring, list file and apt-get update first); the turn installs without downloading",
                    host.print_prefix, target or "at the newest version offered")  # fmt: skip
    target = yield from _from_repository(toolkit, target)
    if target is None:
        return
    pins = dict.fromkeys(TOOLKIT_PACKAGES, target)
    yield _packages.download(pins)
    _packages.record(pins)


def _from_repository(toolkit: ToolkitInfo, target: str) -> Generator[Any, Any, str | None]:
    """NVIDIA's repository made known to apt (its keyring, list file, ``apt-get update``); returns the version
    to take: ``target``, or without one the newest the repository offers, read then (and kept from then on);
    None where it offers none (the node is failed)."""
    if not toolkit["keyring_fingerprints"]:
        yield StringCommand(keyring_script())
    if toolkit["repo_list"] != TOOLKIT_REPO_LINE:
        yield from write_file(TOOLKIT_LIST, TOOLKIT_REPO_LINE)
    yield StringCommand("apt-get", "update")
    if target:
        return target
    offered = host.get_fact(NvidiaAptVersions, packages=list(TOOLKIT_PACKAGES))
    newest = newest_common_version(offered, TOOLKIT_PACKAGES)
    if newest is None:
        yield _fail("NVIDIA Container Toolkit: the repository offers no version of all four packages")
    return newest


def toolkit_changes(source: str = TOOLKIT_SOURCE, version: str | None = None, deb_dir: str | None = None) -> list[str]:
    """The disruptive change ``container_toolkit`` would make on this host with the same arguments (reads
    facts, changes nothing): ``toolkit: install …`` where it installs or upgrades the packages, whose
    postinst reloads systemd and (1.18 and later) starts the CDI refresh; ``[]`` where it would only
    hold them, check them, change nothing or fail the host."""
    try:
        version = check_toolkit(source, version, deb_dir)
    except ToolkitRequestError:
        return []
    decided = decision(source, version)
    if decided.install is None:
        return []
    target = decided.install or "the newest version offered"
    return [f"toolkit: install {target} (installed: {decided.installed or 'none'})"]


def _toolkit_checked(toolkit: ToolkitInfo, version: str | None, quiet: bool = False) -> Generator[Any, Any, None]:
    """``installed``: the toolkit's packages, or its two binaries on PATH without them, at ``version``
    (``quiet``: a command was yielded before, so a right toolkit is no no-op)."""
    packages = toolkit["packages"]
    if all(name in packages for name in TOOLKIT_PACKAGES):
        found = packages["nvidia-container-toolkit"]
        if version is not None and any(packages[n] != version for n in TOOLKIT_PACKAGES):
            yield _fail(f"NVIDIA Container Toolkit is {found}, not {version}")
        elif not toolkit["runtime_binary"]:
            yield _fail("NVIDIA Container Toolkit is installed but nvidia-container-runtime is not on PATH")
        elif not quiet:
            host.noop(f"NVIDIA Container Toolkit {found} is installed")
    elif toolkit.get("ctk_path") and toolkit["runtime_binary"]:
        found = toolkit["ctk_version"] or "of unknown version"
        if version is not None and found != upstream_version(version):
            yield _fail(f"NVIDIA Container Toolkit found outside the package manager is {found}, not {version}")
        elif not quiet:
            host.noop(
                f"NVIDIA Container Toolkit {found} is installed outside the package manager: "
                f"{toolkit.get('ctk_path')}, {toolkit['runtime_binary']}"
            )
    else:
        missing = [n for n in TOOLKIT_PACKAGES if n not in packages]
        on_path = [n for n, key in (("nvidia-ctk", "ctk_path"), ("nvidia-container-runtime", "runtime_binary"))
                   if not toolkit.get(key)]  # fmt: skip
        yield _fail(
            f"NVIDIA Container Toolkit is not installed (missing packages: {', '.join(missing) or '-'}; "
            f"not on PATH: {', '.join(on_path)})"
        )


# The script without its comment lines (it has no here-documents): what the node runs.
_KEYRING_SCRIPT = shell.script(Path(__file__).parent / "shell" / "toolkit-keyring.sh")


def keyring_script(
    fingerprint: str = TOOLKIT_FINGERPRINT, url: str = TOOLKIT_KEY_URL, keyring: str = TOOLKIT_KEYRING
) -> str:
    """Shell that downloads the key file at ``url`` and writes exactly the key ``fingerprint`` to ``keyring``
    (``shell/toolkit-keyring.sh``, its arguments quoted).

    The key file is imported into a throwaway gpg home and only the pinned key is exported from it,
    so other keys in the file never reach the keyring; it fails naming what the file holds when the
    pinned key is not among them.
    """
    return shell.command(_KEYRING_SCRIPT, "gpunode-keyring", fingerprint, url, keyring)


def _install_debs(deb_dir: str, version: str | None) -> StringCommand:
    """apt-get install of the four packages' .deb files from ``deb_dir`` (one version)."""
    pattern = version or "*"
    folder = shlex.quote(deb_dir.rstrip("/") + "/")
    paths = " ".join(f"{folder}{name}_{pattern}_*.deb" for name in TOOLKIT_PACKAGES)
    return StringCommand(
        "env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y --no-install-recommends "
        f"--allow-change-held-packages {paths}"
    )
