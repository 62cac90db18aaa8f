"""pipelines/_settings.py: a host's data validated once per run while it stays the same, again once it
changed; a refusal raised on every call, never kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.hostdata import HostDataError
from pyinfra_gpunode.pipelines._settings import validated_settings


@pytest.fixture
def node() -> Iterator[Host]:
    data = {"fake_delay": 0, "fake_delay_jitter": 0, "gpunode_restart_timeout": 90}
    state = State(inventory=Inventory(([("@fake/a", data)], {})), config=Config())
    connect_all(state)
    try:
        found = state.inventory.get_host("@fake/a")
        with ctx_state.use(state), ctx_host.use(found):
            yield found
    finally:
        disconnect_all(state)


def test_the_same_data_is_validated_once_and_changed_data_again(node: Host) -> None:
    first = validated_settings()
    assert validated_settings() is first and first.containerd.restart_timeout == 90
    node.data.gpunode_restart_timeout = 120
    assert validated_settings().containerd.restart_timeout == 120


def test_a_refusal_is_raised_each_time(node: Host) -> None:
    node.data.gpunode_restart_timeout = 86400
    for _ in range(2):
        with pytest.raises(HostDataError, match="gpunode_restart_timeout"):
            validated_settings()
