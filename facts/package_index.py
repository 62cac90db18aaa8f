"""Facts about what apt's package index offers: the versions of packages, and the files an install
would fetch."""

from __future__ import annotations

import re
import shlex
from typing import TypedDict

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from typing_extensions import override

from pyinfra_gpunode.read_limits import APT_SECONDS, TIMED_OUT, TIMED_OUT_LINE, did_not_answer

APT_TIMED_OUT = TIMED_OUT_LINE  # apt-cache did not answer within APT_SECONDS
MADISON_LINES_MAX = 20000  # lines an answer may have: a version per line, of a few dozen packages

# apt options that keep apt-cache from writing its binary caches (pkgcache.bin, srcpkgcache.bin).
APT_READ_ONLY = "-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache="


class NvidiaAptVersions(FactBase[dict[str, list[str]]]):
    """
    Returns the versions the package index offers for each package, newest first
    (``apt-cache madison``); packages the index does not know are absent. apt's binary caches
    are built in memory only, so reading writes nothing under ``/var/cache/apt``.

    .. code:: python

        {"nvidia-driver": ["550.163.01-2"], "nvidia-kernel-dkms": ["550.163.01-2"]}
    """

    @override
    def command(self, packages: list[str]) -> str:
        names = " ".join(shlex.quote(name) for name in packages)
        return (
            f"timeout {APT_SECONDS} apt-cache {APT_READ_ONLY} madison {names} 2>/dev/null "
            f"|| [ $? != {TIMED_OUT} ] || echo {shlex.quote(APT_TIMED_OUT)}"
        )

    @staticmethod
    def default() -> dict[str, list[str]]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[str, list[str]]:
        if APT_TIMED_OUT in output:
            raise FactProcessError(did_not_answer("apt-cache madison", APT_SECONDS))
        if len(output) > MADISON_LINES_MAX:
            raise FactProcessError(f"apt-cache madison printed more than {MADISON_LINES_MAX} lines")
        versions: dict[str, list[str]] = {}
        for line in output:
            parts = [part.strip() for part in line.split("|")]
            if len(parts) < 3 or not parts[0] or not parts[1]:
                continue
            if not parts[2].endswith(("Packages", "Sources")) or parts[2].endswith("Sources"):
                continue
            found = versions.setdefault(parts[0], [])
            if parts[1] not in found:
                found.append(parts[1])
        return versions


class AptFile(TypedDict):
    name: str  # the .deb file's name in /var/cache/apt/archives ("": apt's line did not read as one)
    size: int  # bytes


class AptDownloadsInfo(TypedDict):
    """``AptDownloads``'s value."""

    files: list[AptFile]
    error: str | None


_DEB_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+~%_:-]*\.deb\Z")
APT_DOWNLOADS_MAX = 2000  # files an answer may list; more is no node's driver or toolkit
APT_ERROR_MAX = 500  # characters of apt's error kept


class AptDownloads(FactBase[AptDownloadsInfo]):
    """
    Returns the ``.deb`` files apt would fetch to install ``packages`` (``name=version`` or ``name``),
    with what they depend on, and apt's first error (a version the index does not offer, a conflict),
    or None (``apt-get install --print-uris``). Files already in ``/var/cache/apt/archives`` are not
    listed, so an empty list means the install needs no download. Nothing is installed, downloaded
    or locked, and apt's binary caches are built in memory only.

    .. code:: python

        {"files": [{"name": "nvidia-driver_550.163.01-2_amd64.deb", "size": 493100}], "error": None}
    """

    @override
    def command(self, packages: list[str]) -> str:
        return self._command(packages)

    @staticmethod
    def _command(packages: list[str], options: str = "") -> str:
        pins = " ".join(shlex.quote(pin) for pin in packages)
        return (
            f"timeout {APT_SECONDS} apt-get {APT_READ_ONLY} --print-uris -qq -y --no-install-recommends "
            f'--allow-change-held-packages install {options}{pins} 2>&1; echo "rc=$?"'
        )

    @staticmethod
    def default() -> AptDownloadsInfo:
        return {"files": [], "error": None}

    @override
    def process(self, output: list[str]) -> AptDownloadsInfo:
        files: list[AptFile] = []
        errors: list[str] = []
        status = None
        for line in output:
            if line.startswith("'"):  # 'URI' FILE SIZE HASH
                parts = line.split()
                if len(parts) >= 3 and _DEB_FILE.match(parts[1]) and parts[2].isdigit():
                    files.append({"name": parts[1], "size": int(parts[2])})
                else:  # a file all the same: the install is not ready without a download
                    files.append({"name": "", "size": 0})
                if len(files) > APT_DOWNLOADS_MAX:
                    raise FactProcessError(f"apt would fetch more than {APT_DOWNLOADS_MAX} files")
            elif line.startswith("E: "):
                errors.append(line[3:].strip()[:APT_ERROR_MAX])
            elif line.startswith("rc="):
                status = line[3:].strip()
        error = errors[0] if errors else None
        if status == str(TIMED_OUT):
            error = did_not_answer("apt-get --print-uris", APT_SECONDS)
        elif error is None and status not in (None, "0"):
            error = f"apt-get exited {status[:10]}"
        return {"files": files, "error": error}


class AptReinstallDownloads(AptDownloads):
    """
    Returns, as ``AptDownloads`` does, the ``.deb`` files apt would fetch to install ``packages`` again
    at the versions installed (``--reinstall``): what putting them back after a change would need. Files
    already in ``/var/cache/apt/archives`` are not listed.

    .. code:: python

        {"files": [{"name": "nvidia-driver_550.144.03-1_amd64.deb", "size": 493100}], "error": None}
    """

    @override
    def command(self, packages: list[str]) -> str:
        return self._command(packages, "--reinstall ")
