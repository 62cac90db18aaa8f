"""Results of pure functions kept by their arguments' content, for a fleet whose nodes send the same texts
(no I/O).

A fleet's nodes mostly carry the same files, release files and configs: what a pure function made of one
node's is what it makes of the next one's. ``by_content`` keeps a bounded number of results, keyed by the
``repr`` of the arguments (plain values: strings, numbers, lists, dicts, frozen dataclasses; two different
values never share a ``repr``, equal ones written in another order only miss), and hands each caller its own
copy (``copied``), so no caller sees another's changes. Exceptions are raised again on each call, never kept.
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

KEPT_RESULTS = 64  # per function; all dropped when full (a fleet has few distinct configs)
KEPT_KEY_CHARACTERS = 256 << 10  # larger arguments are worked out each time, never kept
_MISSING = object()


def by_content(function: F) -> F:
    """``function`` (pure: its result depends on its arguments' content alone), each result kept by that
    content and handed out as a copy."""
    kept: dict[str, Any] = {}

    @functools.wraps(function)
    def remembered(*args: Any, **kwargs: Any) -> Any:
        key = repr((args, sorted(kwargs.items())))
        found = kept.get(key, _MISSING)
        if found is _MISSING:
            found = function(*args, **kwargs)
            if len(key) <= KEPT_KEY_CHARACTERS:
                if len(kept) >= KEPT_RESULTS:
                    kept.clear()
                kept[key] = found
        return copied(found)

    remembered.forget = kept.clear  # type: ignore[attr-defined]
    return cast(F, remembered)


def copied(data: Any) -> Any:
    """A copy of ``data`` no change to which reaches ``data``: dicts and lists (parsed TOML and JSON, and what
    is made of them) copied level by level, values no one can change (strings, numbers, booleans, dates and
    times) shared, anything else deep-copied. Several times faster than ``copy.deepcopy`` on parsed
    configs, which a run paid for every node's dump."""
    kind = type(data)
    if kind is dict:
        return {key: copied(value) for key, value in data.items()}
    if kind is list:
        return [copied(value) for value in data]
    if kind in _UNCHANGING:
        return data
    return copy.deepcopy(data)


_UNCHANGING = frozenset({str, int, float, bool, type(None), datetime.datetime, datetime.date, datetime.time})
