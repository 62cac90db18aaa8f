"""Composite facts: one command that reads several facts of a node at once, each part declared once.

A composite fact declares its parts in ``parts`` (part name, which is also its key in the fact's value,
-> ``Part``): the fact the part holds and how that fact's arguments come from the composite's. Where
the composite joins its parts with ``join_parts`` and takes them apart with ``split_parts``, its
command and value are made from that declaration (``joined_command``, ``split_values``); the reads one
node shares between operations (``operations/_shared.py``) find the facts a read holds through it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase

from pyinfra_gpunode.sections import join_parts, split_parts

Fact = type[FactBase[Any]]


def no_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A part read with its fact's default arguments, whatever the composite's are."""
    return {}


@dataclass(frozen=True)
class Part:
    """One part of a composite fact.

    ``fact``: the fact the part holds, as that fact returns it (None: a section of the composite's own);
    ``arguments``: that fact's arguments from the composite's (None: under these arguments the part is
    not what the fact would return, e.g. the containerd of a platform); ``from_value``: arguments only
    the composite's value tells (the config containerd's unit names); ``script``: the part's command
    from the composite's arguments (default: the fact's command with its arguments); ``read``: the
    part's value from its lines (default: the fact's ``process``); ``none_unread``: a None value means
    the part was not read (no journal), so it holds nothing."""

    fact: Fact | None = None
    arguments: Callable[[Mapping[str, Any]], dict[str, Any] | None] = no_arguments
    from_value: Callable[[Any], dict[str, Any]] | None = None
    script: Callable[[Mapping[str, Any]], str] | None = None
    read: Callable[[list[str]], Any] | None = None
    none_unread: bool = False

    def command(self, arguments: Mapping[str, Any]) -> str:
        """The part's command within the composite read with ``arguments``."""
        if self.script is not None:
            return self.script(arguments)
        assert self.fact is not None, "a part of the composite's own needs a script"
        return str(self.fact().command(**(self.arguments(arguments) or {})))

    def value(self, lines: list[str]) -> Any:
        """The part's value from its lines of the composite's output."""
        if self.read is not None:
            return self.read(lines)
        assert self.fact is not None, "a part of the composite's own needs a read"
        return self.fact().process(lines)

    def held(self, key: str, arguments: Mapping[str, Any], value: Any) -> tuple[dict[str, Any], Any] | None:
        """``(the fact's arguments, its value)`` as a composite read with ``arguments`` that returned ``value``
        holds the part ``key``; None where it holds nothing the fact would return."""
        if self.fact is None or not isinstance(value, Mapping) or key not in value:
            return None
        found = value[key]
        wanted = self.arguments(arguments)
        if wanted is None or (found is None and self.none_unread):
            return None
        if self.from_value is not None:
            wanted = {**wanted, **self.from_value(value)}
        return wanted, found


def parts_of(fact: Fact) -> Mapping[str, Part]:
    """The parts ``fact`` declares (none where it is no composite)."""
    parts: Mapping[str, Part] = getattr(fact, "parts", {})
    return parts


def composites(root: Fact) -> list[Fact]:
    """``root`` and every composite fact it holds, however deep, each once, nearest first."""
    found, pending = [], [root]
    while pending:
        fact = pending.pop(0)
        if fact in found or not parts_of(fact):
            continue
        found.append(fact)
        pending += [part.fact for part in parts_of(fact).values() if part.fact is not None]
    return found


def holders(root: Fact) -> dict[Fact, list[tuple[Fact, str, Part]]]:
    """Every fact held under ``root`` -> ``(the composite holding it, the part's name, the part)`` for each
    composite that holds it, nearest first."""
    table: dict[Fact, list[tuple[Fact, str, Part]]] = {}
    for whole in composites(root):
        for key, part in parts_of(whole).items():
            if part.fact is not None:
                table.setdefault(part.fact, []).append((whole, key, part))
    return table


def joined_command(prefix: str, parts: Mapping[str, Part], arguments: Mapping[str, Any]) -> str:
    """The command of a composite that joins its parts with ``join_parts`` (line ``<prefix><name>`` before each)."""
    return join_parts(prefix, {key: part.command(arguments) for key, part in parts.items()})


def split_values(prefix: str, parts: Mapping[str, Part], output: Iterable[str]) -> dict[str, Any]:
    """Each part's value from the output of ``joined_command``'s command (a missing part's from no lines)."""
    return part_values(parts, split_parts(output, prefix, parts))


def part_values(parts: Mapping[str, Part], sections: Mapping[str, list[str]]) -> dict[str, Any]:
    """Each part's value from its lines in ``sections`` (``split_parts``' value)."""
    return {key: part.value(sections[key]) for key, part in parts.items()}
