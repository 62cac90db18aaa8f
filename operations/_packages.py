"""Package installs, holds and downloads into apt's cache, shared by the driver, Fabric Manager and toolkit
operations, and what each node downloaded before the rollout's turns."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from pyinfra import host, state
from pyinfra.api import QuoteString, State, StringCommand

from pyinfra_gpunode import shell
from pyinfra_gpunode.facts.package_index import AptDownloads, AptDownloadsInfo, AptReinstallDownloads
from pyinfra_gpunode.log import logger, shown
from pyinfra_gpunode.operations._atomic import fail as _fail
from pyinfra_gpunode.operations._internals import current_state, in_a_run
from pyinfra_gpunode.operations._run_state import run_state


def pins_of(packages: Mapping[str, str]) -> list[str]:
    """``name=version`` (``name`` where any version will do), sorted by name."""
    return [f"{name}={version}" if version else name for name, version in sorted(packages.items())]


def _install_arguments(packages: Mapping[str, str], download: bool) -> list[str]:
    return [
        "-y",
        "--no-install-recommends",
        "--allow-change-held-packages",
        *([] if download else ["--no-download"]),
        *pins_of(packages),
    ]


def install(packages: dict[str, str], download: bool = True) -> StringCommand:
    """apt-get install of exactly these versions; without ``download`` only from apt's cache (apt fails
    rather than fetch a file that is not there)."""
    return StringCommand(
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "NEEDRESTART_SUSPEND=1",
        "apt-get",
        "install",
        *[QuoteString(argument) for argument in _install_arguments(packages, download)],
    )


# apt-get install whose failure is followed by the last lines of the DKMS build logs it wrote.
_INSTALL_BUILT_SCRIPT = shell.script(Path(__file__).parent / "shell" / "apt-install-built.sh")


def install_built(packages: dict[str, str], version: str, replaces: str = "", download: bool = True) -> StringCommand:
    """``install`` of driver ``version``'s packages, whose install may build a kernel module with DKMS, in place
    of driver ``replaces`` (``""``: none): its packages are removed once the new ones are installed and built.
    Where apt fails, the last lines of the build logs follow its output, naming what broke the build, and the
    node is put back: the new version's packages removed, the replaced driver's at their versions, held."""
    arguments = _install_arguments(packages, download)
    return StringCommand(shell.command(_INSTALL_BUILT_SCRIPT, "gpunode-install-built", replaces, version, *arguments))


def restore_built(previous: Mapping[str, str], old: str, new: str) -> StringCommand:
    """Put driver ``old``'s packages (``previous``: name -> exact version) back in place of driver ``new``'s,
    which installed but did not load: ``new``'s packages removed, ``previous`` installed from apt's cache
    (downgraded where ``new`` replaced them) and held."""
    pins = pins_of(previous)
    return StringCommand(shell.command(_INSTALL_BUILT_SCRIPT, "gpunode-install-built", "--restore", old, new, *pins))


# Downloads into apt's cache, installing nothing; ends with apt's first error when it fails.
_DOWNLOAD_SCRIPT = shell.script(Path(__file__).parent / "shell" / "apt-download.sh")


def download(packages: Mapping[str, str], reinstall: bool = False) -> StringCommand:
    again = ["--reinstall"] if reinstall else []
    return StringCommand(shell.command(_DOWNLOAD_SCRIPT, "gpunode-download", *again, *pins_of(packages)))


def downloaded_packages(run: State, name: str) -> dict[str, str] | None:
    """What ``driver_downloaded`` and ``container_toolkit_downloaded`` put in node ``name``'s apt cache in
    this run (``{}``: nothing was needed); None where neither ran there."""
    found = run_state(run).downloaded.get(name)
    return None if found is None else dict(found)


def record(packages: Mapping[str, str]) -> None:
    """Remember, for the node's turn, what is in its apt cache now (only once the run executes)."""
    if state.is_executing and in_a_run():
        run_state(current_state()).downloaded.setdefault(host.name, {}).update(packages)


def _size(total: int) -> str:
    return f"{total / 1e6:.1f} MB" if total >= 100_000 else f"{total / 1e3:.1f} kB"


def downloaded(
    what: str, packages: dict[str, str], needed: AptDownloadsInfo | None = None
) -> Generator[Any, Any, None]:
    """Download ``packages`` (what the turn installs) into apt's cache; nothing when apt needs no file.
    ``needed``: apt's answer for them, when read already."""
    pins = pins_of(packages)
    if needed is None:
        needed = host.get_fact(AptDownloads, packages=pins)
    if needed["error"]:
        yield _fail(f"{what}: apt cannot install {', '.join(pins)}: {shown(needed['error'], 200)}")
        return
    if not needed["files"]:
        record(packages)
        if not state.is_executing:
            logger.info("%splan: %s in apt's cache: %s; the turn installs without downloading",
                        host.print_prefix, what, ", ".join(pins))  # fmt: skip
        host.noop(f"{what} packages are in apt's cache: {', '.join(pins)}")
        return
    if not state.is_executing:
        total = sum(found["size"] for found in needed["files"])
        logger.info("%splan: download before the turns: %s (%d files, %s); the turn installs without downloading",
                    host.print_prefix, ", ".join(pins), len(needed["files"]), _size(total))  # fmt: skip
    yield download(packages)
    record(packages)


def kept(what: str, packages: dict[str, str]) -> StringCommand | None:
    """The command that fetches the installed ``packages`` (``what`` they are) again into apt's cache where their
    files are not there, so that a change that fails after its install can put them back without a download;
    None where nothing is to fetch. Where apt cannot fetch them (the archive moved on), None too: the plan warns
    that they cannot be put back, and the node goes on. Logs the plan (call it before the first command)."""
    pins = pins_of(packages)
    needed = host.get_fact(AptReinstallDownloads, packages=pins)
    if needed["error"]:
        logger.warning("%s%s cannot be fetched again (apt: %s): where the change from it fails, it cannot be put "
                       "back", host.print_prefix, what, shown(needed["error"], 200))  # fmt: skip
        return None
    if not needed["files"]:
        if not state.is_executing:
            logger.info("%splan: %s in apt's cache, to put back where the change fails: %s",
                        host.print_prefix, what, ", ".join(pins))  # fmt: skip
        return None
    if not state.is_executing:
        total = sum(found["size"] for found in needed["files"])
        logger.info("%splan: download before the turns, to put back where the change fails: %s %s (%d files, %s)",
                    host.print_prefix, what, ", ".join(pins), len(needed["files"]), _size(total))  # fmt: skip
    return download(packages, reinstall=True)


def hold(names: list[str]) -> StringCommand:
    return StringCommand("apt-mark", "hold", *[QuoteString(name) for name in sorted(names)])
