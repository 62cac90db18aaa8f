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
from typing import Any, TypeVar, cast, overload

F = TypeVar("F", bound=Callable[..., Any])

KEPT_RESULTS = 64  # per function; all dropped when full (a fleet has few distinct configs)
KEPT_KEY_CHARACTERS = 64 << 10  # larger arguments (a parse of them is large too) are worked out each time
_MISSING = object()


@overload
def by_content(function: F) -> F: ...


@overload
def by_content(*, key: Callable[..., Any]) -> Callable[[F], F]: ...


def by_content(function: F | None = None, *, key: Callable[..., Any] | None = None) -> Any:
    """``function`` (pure: its result depends on its arguments' content alone), each result kept by that
    content and handed out as a copy. ``key``: what of the arguments (called with them) the result depends
    on, where an argument only bounds the work (a time limit): a result is kept under it, never one of a
    call that raised."""

    def wrap(function: F) -> F:
        kept: dict[str, Any] = {}

        @functools.wraps(function)
        def remembered(*args: Any, **kwargs: Any) -> Any:
            content = key(*args, **kwargs) if key is not None else (args, sorted(kwargs.items()))
            found_key = repr(content)
            found = kept.get(found_key, _MISSING)
            if found is _MISSING:
                found = function(*args, **kwargs)
                if len(found_key) <= KEPT_KEY_CHARACTERS:
                    if len(kept) >= KEPT_RESULTS:
                        kept.clear()
                    kept[found_key] = found
            return copied(found)

        return cast(F, remembered)

    return wrap(function) if function is not None else wrap


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
