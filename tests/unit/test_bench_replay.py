"""The controller bench's replaying connector: a recorded command is answered, any other fails naming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.host import Host

from bench.replay import Answer, ReplayConnector, UnrecordedCommand, command_key, use_connector


@pytest.fixture
def node() -> Iterator[Host]:
    """A node named ``sim7`` whose connector is the replaying one, answering two recorded commands."""
    undo = use_connector(ReplayConnector)
    try:
        inventory = Inventory((["sim7"], {}))
    finally:
        undo()
    answers = ReplayConnector.answers
    ReplayConnector.answers = {
        "sh -c true": Answer(0, "", ""),
        "sh -c 'cat /etc/{node}.conf'": Answer(1, "first\nsecond\n", "cat: partly read\n"),
    }
    try:
        connect_all(State(inventory=inventory, config=Config()))
        yield inventory.get_host("sim7")
    finally:
        ReplayConnector.answers = answers


def test_a_recorded_command_gets_its_output_and_exit_status(node: Host) -> None:
    assert isinstance(node.connector, ReplayConnector)
    success, output = node.run_shell_command(StringCommand("true"))
    assert success
    assert output.combined_lines == []
    success, output = node.run_shell_command(StringCommand("cat", "/etc/sim7.conf"))  # its name, as a key
    assert not success
    assert output.stdout_lines == ["first", "second"]
    assert output.stderr_lines == ["cat: partly read"]
    success, _ = node.run_shell_command(StringCommand("cat", "/etc/sim7.conf"), _success_exit_codes=[0, 1])
    assert success


def test_an_unrecorded_command_fails_naming_it(node: Host, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UnrecordedCommand, match=r"sim7: sh -c 'systemctl restart containerd'"):
        node.run_shell_command(StringCommand("systemctl", "restart", "containerd"))
    assert "UNRECORDED COMMAND: " in capsys.readouterr().err
    with pytest.raises(UnrecordedCommand, match="upload to sim7:/etc/x"):
        node.put_file("/dev/null", "/etc/x")


def test_keys_hold_what_varies_between_nodes_and_runs_as_placeholders() -> None:
    line = "sh -c 'tar -cf /var/lib/b/sim7-20261201T204110.485522Z.tar && cp /tmp/pyinfra-3f9a0c1d /etc/x'"
    assert (
        command_key(line, "sim7")
        == "sh -c 'tar -cf /var/lib/b/{node}-{timestamp}.tar && cp /tmp/pyinfra-{temp} /etc/x'"
    )
