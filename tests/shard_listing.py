"""``-p tests.shard_listing``: after collection, one line per test: ``SHARD <node id> <shard> <marks>``, the
shard ``tests/conftest.py`` gives it and its ``fleet``/``vm`` marks (``-`` for none), for ``test_shards``."""

from __future__ import annotations

import pytest

from tests.conftest import shard_of


def pytest_collection_finish(session: pytest.Session) -> None:
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    for item in session.items:
        marks = ",".join(name for name in ("fleet", "vm") if item.get_closest_marker(name)) or "-"
        terminal.write_line(f"SHARD {item.nodeid} {shard_of(item)} {marks}")
