"""``fail()``: the host fails with the message on stderr exactly as written, backslashes included."""

from __future__ import annotations

import subprocess

from pyinfra.api import State
from pyinfra.api.inventory import Inventory
from pyinfra.context import ctx_host, ctx_state

from pyinfra_gpunode.operations._atomic import fail


def test_fail_prints_the_message_verbatim_and_exits_1() -> None:
    message = r"key 'a\nb' at C:\temp\x41 is refused; it's 100% wrong"
    state = State(inventory=Inventory((["@local"], {})))
    state.is_executing = True
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host("@local")):
        command = fail(message).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == message + "\n"
    assert result.stdout == ""
