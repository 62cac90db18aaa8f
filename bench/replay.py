"""pyinfra connectors for the controller bench: one that records what a real node answers, one that replays it.

``RecordingConnector`` is pyinfra's SSH connector that keeps, per command, the node's stdout, stderr and
exit status. ``ReplayConnector`` answers every command from those recordings without touching anything:
a command is matched by its key (the command line as the SSH connector sends it, with the node's name,
pyinfra's temporary paths and timestamps replaced by placeholders), and a command without a recording
raises ``UnrecordedCommand`` naming it (an upload or download too). The recorded host's machine id and
boot id are made each simulated node's own in its answers: no two nodes of a run are one machine.
Neither is registered as a pyinfra entry point: a bench puts the class in place of the SSH connector for
the run (``use_connector``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from io import IOBase
from pathlib import Path
from typing import Any, ClassVar

from pyinfra import logger
from pyinfra.api import inventory as api_inventory
from pyinfra.api.command import StringCommand
from pyinfra.api.output import echo
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import CommandOutput, OutputLine, make_unix_command_for_host

NODE = "{node}"
# What differs between nodes or runs inside one command line, and what stands for it in a key.
VARYING = (
    (re.compile(r"/tmp/pyinfra-[0-9a-f]+"), "/tmp/pyinfra-{temp}"),
    (re.compile(r"\b\d{8}T\d{6}(?:\.\d+)?Z"), "{timestamp}"),
)
# Arguments that steer the connector itself; the rest shape the command line (pyinfra's SSH connector).
CONTROL_ARGUMENTS = ("_get_pty", "_timeout", "_stdin", "_success_exit_codes")
# The recorded host's own ids in its answers (the lines after these markers of the node's identity read).
IDENTITY_MARKERS = {"@@machine_id": re.compile(r"^[0-9a-f]{32}$"), "@@boot_id": re.compile(r"^[0-9a-f-]{36}$")}
# A marker's line and the line after it, anywhere in an answer (one pass over the answer, not one per line).
IDENTITY_LINES = re.compile(r"^(" + "|".join(map(re.escape, IDENTITY_MARKERS)) + r")\n([^\n]*)$", re.MULTILINE)
SECRET_MARKERS = ("PRIVATE KEY", "BEGIN OPENSSH", "ssh-ed25519 ", "ssh-rsa ", "password", "token")


class UnrecordedCommand(RuntimeError):
    """A command (or a file transfer) the recordings have no answer for."""


@dataclass(frozen=True)
class Answer:
    exit_status: int
    stdout: str
    stderr: str


def command_key(command_line: str, node: str) -> str:
    """``command_line`` with ``node`` (the host's inventory name), temp paths and timestamps as placeholders."""
    return _placeholders(command_line.replace(node, NODE) if node else command_line)


@functools.lru_cache(maxsize=1024)
def _placeholders(key: str) -> str:
    """``key`` with temp paths and timestamps as placeholders (every node sends the same long commands: worked
    out once each, so that the bench's own cost per node does not grow with a command's length)."""
    for pattern, placeholder in VARYING:
        key = pattern.sub(placeholder, key)
    return key


def command_line(connector: BaseConnector, command: StringCommand, arguments: dict[str, Any]) -> str:
    """The command line pyinfra's SSH connector would send for ``command`` with these global arguments."""
    shaping = {key: value for key, value in arguments.items() if key not in CONTROL_ARGUMENTS}
    return make_unix_command_for_host(connector.state, connector.host, command, **shaping).get_raw_value()


def load(path: Path) -> dict[str, Answer]:
    """The recordings of ``path`` (written by ``save``), by key."""
    data = json.loads(path.read_text())
    return {entry["key"]: Answer(entry["exit_status"], entry["stdout"], entry["stderr"]) for entry in data["commands"]}


def save(path: Path, header: dict[str, Any], answers: dict[str, Answer]) -> None:
    """Write the recordings with ``header`` first; refused (naming the key) where an answer looks like a secret."""
    for key, answer in answers.items():
        for marker in SECRET_MARKERS:
            if marker.lower() in (answer.stdout + answer.stderr).lower():
                raise ValueError(f"recorded answer to {key[:80]!r} contains {marker!r}: not saved")
    commands = [{"key": key, **asdict(answer)} for key, answer in sorted(answers.items())]
    path.write_text(json.dumps({**header, "commands": commands}, indent=1) + "\n")


def own_ids(stdout: str, node: str) -> str:
    """``stdout`` with the recorded host's machine id and boot id replaced by ids of ``node``'s own."""

    def own(found: re.Match[str]) -> str:
        marker, value = found.group(1), found.group(2)
        if not IDENTITY_MARKERS[marker].match(value):
            return found.group(0)
        digest = hashlib.sha256(f"{node}:{marker}\n".encode()).hexdigest()[:32]
        return f"{marker}\n{digest if len(value) == 32 else uuid.UUID(digest)}"

    return IDENTITY_LINES.sub(own, stdout)


class ReplayConnector(BaseConnector):
    """Answers every command from ``answers`` (set on the class before the run); never connects anywhere."""

    handles_execution = True
    answers: ClassVar[dict[str, Answer]] = {}

    @staticmethod
    def make_names_data(name: str) -> Iterator[tuple[str, dict, list[str]]]:
        yield name, {}, []

    def run_shell_command(
        self, command: StringCommand, print_output: bool = False, print_input: bool = False, **arguments: Any
    ) -> tuple[bool, CommandOutput]:
        line = command_line(self, command, arguments)
        logger.debug("Running command on %s: (replayed) %s", self.host.name, line)
        if print_input:
            echo(f"{self.host.print_prefix}>>> {line}", err=True)
        key = command_key(line, self.host.name)
        answer = self.answers.get(key)
        if answer is None:
            message = f"no recorded answer for the command sent to {self.host.name}: {key}"
            print(f"UNRECORDED COMMAND: {message}", file=sys.stderr, flush=True)
            raise UnrecordedCommand(message)
        stdout = own_ids(answer.stdout, self.host.name)
        lines = [OutputLine("stdout", text) for text in stdout.splitlines()]  # new strings per node, as
        lines += [OutputLine("stderr", text) for text in answer.stderr.splitlines()]  # SSH decodes them
        if print_output:
            for output in lines:
                echo(f"{self.host.print_prefix}{output.line}", err=True)
        success_codes = arguments.get("_success_exit_codes")
        success = answer.exit_status in success_codes if success_codes else answer.exit_status == 0
        return success, CommandOutput(lines)

    def put_file(self, filename_or_io: str | IOBase, remote_filename: str, *args: Any, **kwargs: Any) -> bool:
        raise UnrecordedCommand(f"upload to {self.host.name}:{remote_filename}: the recordings have no uploads")

    def get_file(self, remote_filename: str, filename_or_io: str | IOBase, *args: Any, **kwargs: Any) -> bool:
        raise UnrecordedCommand(f"download of {self.host.name}:{remote_filename}: the recordings have no downloads")


class RecordingConnector(SSHConnector):
    """pyinfra's SSH connector, keeping each command's answer in ``recorded`` by key (the first answer wins;
    a later, different answer to the same key is counted in ``differing``)."""

    recorded: ClassVar[dict[str, Answer]] = {}
    differing: ClassVar[list[str]] = []

    def connect(self) -> None:
        super().connect()
        assert self.client is not None
        exec_command = self.client.exec_command

        def remembered(*args: Any, **kwargs: Any) -> Any:
            streams = exec_command(*args, **kwargs)
            self._channel = streams[1].channel  # for the exit status, once the command has ended
            return streams

        self.client.exec_command = remembered  # type: ignore[method-assign]

    def run_shell_command(
        self, command: StringCommand, print_output: bool = False, print_input: bool = False, **arguments: Any
    ) -> tuple[bool, CommandOutput]:
        key = command_key(command_line(self, command, dict(arguments)), self.host.name)
        success, output = super().run_shell_command(command, print_output, print_input, **arguments)
        answer = Answer(
            self._channel.recv_exit_status(), "".join(f"{line}\n" for line in output.stdout_lines),
            "".join(f"{line}\n" for line in output.stderr_lines),
        )  # fmt: skip
        known = self.recorded.setdefault(key, answer)
        if known != answer:
            self.differing.append(key)
        return success, output


def use_connector(connector: type[BaseConnector]) -> Callable[[], None]:
    """Make ``connector`` the one pyinfra gives hosts without an ``@connector/`` prefix (the SSH connector's
    place) in inventories made from now on; returns the function that undoes it."""
    original = api_inventory.get_execution_connectors

    def execution_connectors() -> dict[str, Any]:
        return {**original(), "ssh": connector}

    api_inventory.get_execution_connectors = execution_connectors

    def undo() -> None:
        api_inventory.get_execution_connectors = original

    return undo
