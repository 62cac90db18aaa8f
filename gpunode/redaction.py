"""Credential values kept out of plans and messages: which TOML keys hold them, and TOML shown without them (no I/O).

A value is a credential when a key on its path is named like one (``is_secret_name``): every
value under it, in any TOML form (tables, inline tables, dotted keys, arrays, multi-line
strings), is shown as ``<redacted>``; so is the password of a URL in any string
(``https://user:<redacted>@mirror.example``).
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import tomlkit
from tomlkit.container import Container, OutOfOrderTableProxy
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Array, InlineTable, Table

from pyinfra_gpunode import node_toml

REDACTED = "<redacted>"
# Whole tables of credentials: registry auth, every header (their values carry tokens).
_SECRET_TABLES = {"auth", "auths", "authorization", "credentials", "headers", "header"}
_SECRET_WORDS = ("password", "passwd", "token", "secret", "credential")
_WORD = re.compile(r"[_\-\s]+")


def is_secret_name(name: str) -> bool:
    """Whether the key ``name`` holds credentials: ``auth``, ``auths``, ``authorization``,
    ``credentials`` or ``headers``/``header`` (everything under them); a name containing
    ``password``, ``passwd``, ``token``, ``secret`` or ``credential`` (``identitytoken``,
    ``auth_token``); or one whose last word is ``key`` (``key``, ``api_key``, ``private-key``).
    ``key_file``, ``key_model`` or ``runtime_type`` are not: their last word is not ``key``."""
    lowered = name.strip().lower()
    return (
        lowered in _SECRET_TABLES or any(word in lowered for word in _SECRET_WORDS) or _WORD.split(lowered)[-1] == "key"
    )


def is_secret(key: str) -> bool:
    """Whether the dotted ``key`` (as ``flatten`` writes it) has a part named like a credential."""
    return any(is_secret_name(part.strip("\"'")) for part in key.split("."))


# The password of a URL's user information (``https://user:password@mirror.example``), wherever a URL stands.
_USERINFO = re.compile(r"(?P<start>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^/\s@]*@")


def without_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it shown as ``<redacted>`` (the user name stays)."""
    return _USERINFO.sub(lambda match: f"{match.group('start')}:{REDACTED}@", text)


def redacted_value(value: Any, secret: bool = False) -> Any:
    """``value`` (parsed TOML: dicts, lists, scalars) with every credential replaced by ``<redacted>``:
    every leaf under a key named like one, and a URL's password in any string; a table's keys stay, an array
    goes whole."""
    if isinstance(value, dict):
        return {key: redacted_value(item, secret or is_secret_name(key)) for key, item in value.items()}
    if secret:
        return REDACTED
    if isinstance(value, list):
        return [redacted_value(item) for item in value]
    if isinstance(value, str):
        return without_url_passwords(value)
    return value


def shown(key: str, value: Any) -> str:
    """``value`` for a message: ``'<redacted>'`` where the dotted ``key`` holds a credential, and
    any credential inside a table or array value redacted too."""
    return repr(REDACTED) if is_secret(key) else repr(redacted_value(value))


def _redact_container(container: Any, secret: bool) -> None:
    """Replace every credential under ``container`` (a tomlkit document, table or inline table) in place."""
    for key in list(container.keys()):
        item = container[key]
        under = secret or is_secret_name(str(key))
        if isinstance(item, (Container, Table, OutOfOrderTableProxy, InlineTable)):
            _redact_container(item, under)
        elif isinstance(item, AoT):
            for table in item:
                _redact_container(table, under)
        elif under:
            container[key] = REDACTED
        elif isinstance(item, Array):
            _redact_array(item)
        elif isinstance(item, str) and without_url_passwords(item) != item:
            container[key] = without_url_passwords(item)


def _redact_array(array: Array) -> None:
    for index, item in enumerate(array):
        if isinstance(item, InlineTable):
            _redact_container(item, False)
        elif isinstance(item, Array):
            _redact_array(item)
        elif isinstance(item, str) and without_url_passwords(item) != item:
            array[index] = without_url_passwords(item)


def redacted(text: str) -> str:
    """TOML ``text`` with every credential value (see ``is_secret_name``) replaced by ``"<redacted>"``.

    The text keeps its layout and comments where the redacted rendering parses back to exactly
    the redacted values; otherwise it is rendered afresh from them. Text that is not valid TOML
    is not shown at all.
    """
    try:
        wanted = redacted_value(node_toml.loads(text))
    except tomllib.TOMLDecodeError as error:
        return f"# not shown: not valid TOML ({error})\n"
    try:
        document = tomlkit.parse(text)
        _redact_container(document, False)
        kept = tomlkit.dumps(document)
        if node_toml.loads(kept) == wanted:
            return kept
    except (TOMLKitError, tomllib.TOMLDecodeError, ValueError):
        pass
    return tomlkit.dumps(wanted)
