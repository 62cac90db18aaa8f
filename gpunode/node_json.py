"""JSON read from a node, parsed within limits (no I/O).

A node's answer is not trusted: ``json.loads`` of a line nested a few thousand levels deep raises
``RecursionError``, which no caller expects and which would end the run for every node. ``loads`` raises
``ValueError`` instead (what callers already turn into that node's own problem) for a text over
``max_bytes`` or one the parser cannot descend.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BYTES = 1 << 20  # far above any NVML answer, provenance line or CRI start line (a few KB)


def loads(text: str, max_bytes: int = MAX_BYTES) -> Any:
    """``json.loads(text)``, raising ``ValueError`` for any text it cannot read within the limits."""
    if len(text) > max_bytes:
        raise ValueError(f"{len(text)} characters of JSON: more than {max_bytes} are not read")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
