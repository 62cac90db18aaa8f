"""Results of pure functions kept by their arguments' content, for a fleet whose nodes send the same texts
(no I/O).

A fleet's nodes mostly carry the same files, release files and configs: what a pure function made of one
node's is what it makes of the next one's. ``by_content`` keeps a bounded number of results, keyed by the
``repr`` of the arguments (plain values: strings, numbers, lists, dicts, frozen dataclasses; two different
values never share a ``repr``, equal ones written in another order only miss), and hands each caller its own
copy (``copied``), so no caller sees another's changes. Exceptions are raised again on each call, never kept.
``by_content(shared=True)`` hands every caller the one result instead, made read-only (``read_only``: a
change raises ``TypeError``, a copy is an ordinary dict or list): for a large result every node keeps for the
run (the parsed dump), which would otherwise be copied, and held, once a node.
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
def by_content(*, key: Callable[..., Any] | None = None, shared: bool = False) -> Callable[[F], F]: ...


def by_content(function: F | None = None, *, key: Callable[..., Any] | None = None, shared: bool = False) -> Any:
    """``function`` (pure: its result depends on its arguments' content alone), each result kept by that
    content and handed out as a copy. ``key``: what of the arguments (called with them) the result depends
    on, where an argument only bounds the work (a time limit): a result is kept under it, never one of a
    call that raised. ``shared``: the result handed out itself, read-only (``read_only``), not copied."""

    def wrap(function: F) -> F:
        kept: dict[str, Any] = {}

        @functools.wraps(function)
        def remembered(*args: Any, **kwargs: Any) -> Any:
            content = key(*args, **kwargs) if key is not None else (args, sorted(kwargs.items()))
            found_key = repr(content)
            found = kept.get(found_key, _MISSING)
            if found is _MISSING:
                found = function(*args, **kwargs)
                if shared:
                    found = read_only(found)
                if len(found_key) <= KEPT_KEY_CHARACTERS:
                    if len(kept) >= KEPT_RESULTS:
                        kept.clear()
                    kept[found_key] = found
            return found if shared else copied(found)

        return cast(F, remembered)

    return wrap(function) if function is not None else wrap


def copied(data: Any) -> Any:
    """A copy of ``data`` no change to which reaches ``data``: dicts and lists (parsed TOML and JSON, and what
    is made of them) copied level by level, values no one can change (strings, numbers, booleans, dates and
    times) shared, anything else deep-copied; a read-only dict or list (``read_only``) copied as an ordinary
    one. Several times faster than ``copy.deepcopy`` on parsed configs, which a run paid for every node's
    dump."""
    kind = type(data)
    if kind is dict or kind is ReadOnlyDict:
        return {key: copied(value) for key, value in data.items()}
    if kind is list or kind is ReadOnlyList:
        return [copied(value) for value in data]
    if kind in _UNCHANGING:
        return data
    return copy.deepcopy(data)


_UNCHANGING = frozenset({str, int, float, bool, type(None), datetime.datetime, datetime.date, datetime.time})


def _refused(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(f"a {type(self).__name__} is shared by every node whose text it was parsed from: change a copy")


class ReadOnlyDict(dict[Any, Any]):
    """A dict whose changing methods raise ``TypeError``; ``copy.copy``, ``copy.deepcopy`` and ``copied``
    make ordinary dicts (``dict(value)`` a shallow one)."""

    __setitem__ = __delitem__ = __ior__ = _refused
    clear = pop = popitem = setdefault = update = _refused

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copied(self)

    def __reduce__(self) -> Any:  # pickled, as copy does without __copy__: an ordinary dict
        return (dict, (dict(self),))


class ReadOnlyList(list[Any]):
    """A list whose changing methods raise ``TypeError``; copies are ordinary lists."""

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refused
    append = extend = insert = pop = remove = clear = sort = reverse = _refused

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copied(self)

    def __reduce__(self) -> Any:
        return (list, (list(self),))


def read_only(data: Any) -> Any:
    """``data`` with every dict and list in it, however deep, read-only (``ReadOnlyDict``, ``ReadOnlyList``);
    other values as they are (parsed TOML's are strings, numbers, booleans, dates and times)."""
    if isinstance(data, dict):
        return ReadOnlyDict({key: read_only(value) for key, value in data.items()})
    if isinstance(data, list):
        return ReadOnlyList(read_only(value) for value in data)
    return data
