"""TOML read from a node, parsed within limits (no I/O).

A node's file is not trusted: a 1 KB file nested a few hundred levels deep makes ``tomllib`` (and every
recursive walk after it) raise ``RecursionError``, which no caller expects, and would end the run for every
node. ``loads`` raises ``tomllib.TOMLDecodeError`` instead, the error every caller already turns into that
node's own named problem, for a text over ``MAX_BYTES``, a document nested deeper than ``MAX_DEPTH``, or one
the parser cannot descend.
"""

from __future__ import annotations

import tomllib
from typing import Any

from pyinfra_gpunode.memo import copied

MAX_BYTES = 4 << 20  # far above any containerd config or dump (tens of KB)
MAX_DEPTH = 64  # containerd's deepest tables are about 10 levels


def depth(data: Any) -> int:
    """How deeply ``data`` (parsed TOML: tables and arrays) nests, the document itself level 1, counted
    without recursion."""
    deepest, pending = 0, [(data, 0)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            pending.extend((value, level + 1) for value in item.values())
        elif isinstance(item, list):
            pending.extend((value, level + 1) for value in item)
        else:
            continue
        deepest = max(deepest, level + 1)
    return deepest


# Texts parsed in this process, by text (a fleet's nodes carry the same files; one node's files are read by
# several steps): each parsed once, handed out as a copy. Only small texts, and a bounded number of them.
CACHED_BYTES = 64 << 10
CACHED_TEXTS = 256
_parsed: dict[str, dict[str, Any]] = {}


def loads(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``, raising ``tomllib.TOMLDecodeError`` for a text or document beyond the limits;
    a small text parsed before is not parsed again (the caller gets its own copy)."""
    found = _parsed.get(text)
    if found is None:
        found = parsed_within_limits(text)
        if len(text) <= CACHED_BYTES:
            if len(_parsed) >= CACHED_TEXTS:
                _parsed.clear()
            _parsed[text] = found
    return copied(found)  # each caller its own


def parsed_within_limits(text: str) -> dict[str, Any]:
    """``loads`` without its cache: for a caller that keeps the result itself (``containerd_dump.parsed_dump``)."""
    if len(text) > MAX_BYTES:
        raise tomllib.TOMLDecodeError(f"{len(text)} characters: more than {MAX_BYTES} are not read")
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError(f"nested too deeply to read (at most {MAX_DEPTH} levels are)") from None
    found = depth(data)
    if found > MAX_DEPTH:
        raise tomllib.TOMLDecodeError(f"nested {found} levels deep: at most {MAX_DEPTH} are read")
    return data
