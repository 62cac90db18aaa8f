"""Split the output of a fact command that reads several things into named sections (no I/O).

A command prints ``@@name`` before each part; lines before the first marker are dropped.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import TypedDict

MARK = "@@"


def marker(name: str) -> str:
    """The shell command that starts section ``name``."""
    return f"echo '{MARK}{name}'"


def split_sections(lines: Iterable[str]) -> dict[str, list[str]]:
    """``{"name": [lines...]}`` for every ``@@name`` marker, in order; repeated names append."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(MARK) and " " not in line:
            current = sections.setdefault(line[len(MARK) :], [])
        elif current is not None:
            current.append(line)
    return sections


def join_parts(prefix: str, parts: dict[str, str]) -> str:
    """A composite fact's command: each part's command after a line ``<prefix><name>``, in order
    (what ``split_parts`` takes apart)."""
    return "; ".join(f"echo '{prefix}{name}'; {script}" for name, script in parts.items())


def split_parts(lines: Iterable[str], prefix: str, names: Iterable[str]) -> dict[str, list[str]]:
    """The parts of a composite fact's output: ``{"name": [lines...]}`` for each of ``names`` (empty when
    missing), a line ``<prefix><name>`` starting each; lines before the first are dropped."""
    parts: dict[str, list[str]] = {name: [] for name in names}
    current: list[str] = []
    for line in lines:
        if line.startswith(prefix) and line.removeprefix(prefix) in parts:
            current = parts[line.removeprefix(prefix)]
        else:
            current.append(line)
    return parts


class PackageStatus(TypedDict):
    version: str
    held: bool


def parse_dpkg_status(lines: Iterable[str]) -> dict[str, PackageStatus]:
    """Parse ``dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'``.

    Returns installed packages only: ``{name: {"version": str, "held": bool}}``.
    """
    packages: dict[str, PackageStatus] = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        status, name, version = parts[0].strip(), parts[1].strip(), parts[2].strip()
        # second letter: i = installed, W/t = installed with triggers pending
        if len(status) >= 2 and status[1] in "iWt" and name:
            packages[name.split(":", 1)[0]] = {"version": version, "held": status[0] == "h"}
    return packages


DPKG_FORMAT = "${db:Status-Abbrev}\\t${Package}\\t${Version}\\n"  # what parse_dpkg_status reads


def dpkg_query(*patterns: str) -> str:
    """Shell: list packages matching ``patterns`` with status, name and version; exit 0 on none."""
    quoted = " ".join(f"'{pattern}'" for pattern in patterns)
    return f"dpkg-query -W -f={shlex.quote(DPKG_FORMAT)} {quoted} 2>/dev/null || true"
