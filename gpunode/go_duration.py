"""Go's ``time.ParseDuration``, ported (no I/O): containerd reads its duration keys with it, refuses a value it
does not parse with Go's own error, and prints a parsed one in its own form (``4h`` as ``4h0m0s``)."""

from __future__ import annotations

_DURATION_UNITS = {
    b"ns": 1,
    b"us": 10**3,
    "\u00b5s".encode(): 10**3,
    "\u03bcs".encode(): 10**3,
    b"ms": 10**6,
    b"s": 10**9,
    b"m": 60 * 10**9,
    b"h": 3600 * 10**9,
}
_DIGITS = b"0123456789"


def _go_quote(text: bytes) -> str:
    """Go's ``time`` package quoting of a value in its errors: bytes outside printable ASCII as ``\\xNN``."""
    out = ""
    for byte in text:
        if byte >= 0x80 or byte < 0x20:
            out += f"\\x{byte:02x}"
        else:
            out += ("\\" if byte in b'"\\' else "") + chr(byte)
    return f'"{out}"'


def parsed_duration(text: str) -> tuple[int | None, str | None]:
    """``text`` as Go's ``time.ParseDuration`` reads it (what containerd reads a duration key with): its
    nanoseconds, or ``None`` and Go's own error; a port of the Go function, overflow included."""
    raw, limit = text.encode(), 1 << 63
    invalid = f"time: invalid duration {_go_quote(raw)}"
    rest, negative = raw, raw[:1] == b"-"
    if raw[:1] in (b"-", b"+"):
        rest = raw[1:]
    if rest == b"0":
        return 0, None
    if not rest:
        return None, invalid
    total = 0
    while rest:
        if rest[0] not in _DIGITS and rest[:1] != b".":
            return None, invalid
        whole, count = 0, len(rest) - len(rest.lstrip(_DIGITS))
        for digit in rest[:count]:
            whole = whole * 10 + digit - 48
            if whole > limit:
                return None, invalid
        rest, fraction, scale, after = rest[count:], 0, 1.0, 0
        if rest[:1] == b".":
            after = len(rest[1:]) - len(rest[1:].lstrip(_DIGITS))
            for digit in rest[1 : 1 + after]:
                if fraction > (limit - 1) // 10 or fraction * 10 + digit - 48 > limit:
                    break  # Go keeps the digits before an overflow, and skips the rest
                fraction, scale = fraction * 10 + digit - 48, scale * 10
            rest = rest[1 + after :]
        if not count and not after:
            return None, invalid
        unit_end = 0
        while unit_end < len(rest) and rest[unit_end] not in _DIGITS + b".":
            unit_end += 1
        if not unit_end:
            return None, f"time: missing unit in duration {_go_quote(raw)}"
        unit = _DURATION_UNITS.get(rest[:unit_end])
        if unit is None:
            return None, f"time: unknown unit {_go_quote(rest[:unit_end])} in duration {_go_quote(raw)}"
        rest = rest[unit_end:]
        if whole > limit // unit:
            return None, invalid
        whole *= unit
        if fraction:
            whole += int(float(fraction) * (float(unit) / scale))
            if whole > limit:
                return None, invalid
        total += whole
        if total > limit:
            return None, invalid
    if negative:
        return -total, None
    return (total, None) if total < limit else (None, invalid)
