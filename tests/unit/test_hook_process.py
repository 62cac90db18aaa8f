"""Rollout hooks run as real processes on this machine (sh, sleep, setsid, timeout, python): bounded by their
timeout, every process they start ended (``setsid`` too) at the timeout, on Ctrl-C and when the controller is
killed, and their output logged line by line as it comes, bounded."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyinfra.api import Inventory, State
from pyinfra.api.host import Host

from pyinfra_gpunode.hook_process import HookRun, LineCutter, hook_failure, turn_hook

# Writes its own pid and its setsid child's to the file "$1", then waits (as the same process: both pids
# are all there is to clean up if the test fails).
SETSID_HOOK = 'echo $$ > "$1"; setsid sleep 20 & echo $! >> "$1"; echo started; exec sleep 20'

# Ctrl-C raises KeyboardInterrupt, as in a pyinfra started from a terminal, even where this test runs as a
# background job of a shell script (which starts with SIGINT ignored, and so would every process it starts).
CONTROLLER = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from pyinfra_gpunode.hook_process import turn_hook
hook = ("before", sys.argv[1:], 600, "node1", "", [])
"""
# Waits for the hook itself: Ctrl-C comes as a KeyboardInterrupt there.
WAITING = CONTROLLER + 'print(turn_hook(*hook, prefix="[node1] "))\n'
# As the pyinfra CLI does: gevent monkey-patched, the hook waited for in another greenlet while the main
# one takes the KeyboardInterrupt and exits.
IN_A_GREENLET = (
    "from gevent import monkey\nmonkey.patch_all()\nimport gevent\n"
    + CONTROLLER
    + 'gevent.spawn(turn_hook, *hook, prefix="[node1] ")\ngevent.sleep(60)\n'
)


@pytest.fixture
def node() -> Host:
    inventory = Inventory((["node1"], {}))
    State(inventory=inventory)  # gives the host its print prefix
    return inventory.get_host("node1")


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """The file a hook writes its pids to; whatever of them still runs after the test is killed."""
    path = tmp_path / "pids"
    yield path
    for pid in pids(path):
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def running(pid: int) -> bool:
    """``pid`` is a live sleep or sh (not a zombie, not a pid taken again by something else)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and (b"sleep" in command or b"sh" in command)


def run(node: Host, argv: list[str], timeout: float) -> tuple[str | None, float]:
    started = time.monotonic()
    failure = turn_hook("before", argv, timeout, node.name, "", [], prefix=node.print_prefix)
    return failure, time.monotonic() - started


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_timed_out_hook_is_ended_with_what_it_started_through_setsid(node: Host, pidfile: Path) -> None:
    failure, took = run(node, ["sh", "-c", SETSID_HOOK, "hook", str(pidfile)], timeout=1)
    assert took < 4, f"the hook held its 1 s timeout for {took:.1f} s"
    assert failure is not None and failure.startswith(
        "sh timed out after 1 s (gpunode_hook_timeout) and was killed with what it started: "
    ), failure
    hook, child = pids(pidfile)
    assert f"{hook} sleep 20" in failure and f"{child} sleep 20" in failure
    assert not running(hook) and not running(child), "a process the hook started outlived it"


def test_a_double_forked_child_of_a_hook_that_exited_is_ended(node: Host, pidfile: Path) -> None:
    """The hook's child starts a ``setsid`` grandchild and exits, then the hook exits: the grandchild, whose
    parents are gone, is the supervisor's own (a child subreaper) and ended; without it, init's and left."""
    script = '( setsid sleep 20 & echo $! > "$1" ); exit 0'
    failure, _took = run(node, ["sh", "-c", script, "hook", str(pidfile)], timeout=20)
    (grandchild,) = pids(pidfile)
    assert failure is None, failure
    assert not running(grandchild), "the hook's double-forked grandchild outlived it"


def test_a_helper_that_keeps_forking_and_exiting_is_ended(node: Host, pidfile: Path, tmp_path: Path) -> None:
    """Each generation writes its pid, starts the next and exits: at any moment the one alive may be between
    its fork and its exit. The supervisor goes on until none is left, and none is left after it."""
    helper = tmp_path / "helper.sh"
    helper.write_text('#!/bin/sh\necho $$ >> "$1"\nsleep 0.02\n"$0" "$1" &\n')
    helper.chmod(0o755)
    failure, _took = run(node, [str(helper), str(pidfile)], timeout=20)
    assert failure is None, failure
    time.sleep(0.5)
    seen = pids(pidfile)
    time.sleep(0.5)
    assert pids(pidfile) == seen, "a generation of the helper outlived the supervisor and forked again"
    assert not any(running(pid) for pid in seen)


def test_a_hook_waiting_under_timeout_is_bounded_by_its_own_timeout(node: Host) -> None:
    """``timeout`` puts itself in a process group of its own: it is ended all the same."""
    failure, took = run(node, ["sh", "-c", "echo waiting; timeout 45 sleep 45"], timeout=1)
    assert took < 1 + 2 + 1.5, f"the hook held its 1 s timeout for {took:.1f} s"
    assert failure is not None and "timed out after 1 s (gpunode_hook_timeout)" in failure
    assert "timeout 45 sleep 45" in failure and "sleep 45," not in failure.split("timeout 45 sleep 45")[0]


def test_a_hook_ignoring_sigterm_is_killed_after_the_grace(
    node: Host, pidfile: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pyinfra.gpunode")
    script = "trap '' TERM; echo $$ > \"$1\"; exec sleep 20"  # the ignored SIGTERM stays ignored
    failure, took = run(node, ["sh", "-c", script, "hook", str(pidfile)], timeout=1)
    assert 1 + 2 - 0.2 <= took < 1 + 2 + 1.5, f"{took:.1f} s: SIGKILL is to come 2 s after SIGTERM"
    assert failure is not None and "timed out after 1 s" in failure
    (hook,) = pids(pidfile)
    assert not running(hook)
    assert f"[node1] before-hook: ended pid {hook} (sleep 20) with SIGKILL" in caplog.text
    assert "with SIGTERM" not in caplog.text


def test_a_turn_hook_gets_its_argv_filled_in_and_the_turn_in_its_environment(
    node: Host, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pyinfra.gpunode")
    script = 'echo "$1 $GPUNODE_HOOK $GPUNODE_NODE $GPUNODE_HOSTNAME $GPUNODE_TURN $GPUNODE_BATCH"'
    failure = turn_hook(
        "after", ["sh", "-c", script, "hook", "{hostname}"], 20, node.name, "gpu-1.example", ["driver: install 580"],
        prefix=node.print_prefix, turn="2/5", batch="canary 2/2",
    )  # fmt: skip
    assert failure is None
    assert f"[node1] after-hook: sh -c {script!r} hook gpu-1.example" in caplog.messages
    assert "[node1] after-hook | gpu-1.example after node1 gpu-1.example 2/5 canary 2/2" in caplog.messages


def test_output_is_logged_line_by_line_as_it_comes(node: Host, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pyinfra.gpunode")
    failure, _ = run(node, ["sh", "-c", "echo first; sleep 2; echo last >&2; exit 3"], timeout=20)
    ended = time.time()
    assert failure is not None and failure.startswith("sh exited 3 after ") and failure.endswith(" s: last")
    (first,) = [record for record in caplog.records if record.getMessage() == "[node1] before-hook | first"]
    assert first.created < ended - 1.5, "the first line was logged only when the hook ended"
    assert "[node1] before-hook | last" in caplog.messages


def test_huge_output_is_not_held_by_the_controller(node: Host, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pyinfra.gpunode")
    program = "import sys; sys.stdout.write('x' * 20_000_000); sys.stdout.flush(); sys.exit(1)"
    tracemalloc.start()
    try:
        failure, _ = run(node, [sys.executable, "-c", program], timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"the controller held {peak} bytes of a 20 MB line"
    assert failure is not None and "exited 1 after" in failure and len(failure) < 5000
    (line,) = [message for message in caplog.messages if " before-hook | " in message]
    assert line.endswith("x [line cut]") and len(line) < 5000


def controller(pidfile: Path, program: str = WAITING) -> subprocess.Popen[str]:
    """A python process running a before-hook with a 600 s timeout, once the hook has started."""
    argv = [sys.executable, "-c", program, "sh", "-c", SETSID_HOOK, "hook", str(pidfile)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_for(lambda: len(pids(pidfile)) == 2, 10), "the hook did not start"
    return process


def test_killing_the_controller_ends_the_hook_and_what_it_started(pidfile: Path) -> None:
    process = controller(pidfile)
    process.kill()
    process.communicate()
    assert wait_for(lambda: not any(running(pid) for pid in pids(pidfile)), 5), "the hook outlived the controller"


@pytest.mark.parametrize("program", [WAITING, IN_A_GREENLET], ids=["waiting", "in-a-greenlet"])
def test_ctrl_c_ends_the_hook_and_what_it_started(pidfile: Path, program: str) -> None:
    process = controller(pidfile, program)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=10)
    assert "KeyboardInterrupt" in output
    hook, child = pids(pidfile)
    assert not running(hook) and not running(child), "the hook outlived Ctrl-C"
    assert f"[node1] before-hook: ended pid {child} (sleep 20) with SIGTERM" in output, output


def test_a_hook_that_cannot_start_is_named(node: Host) -> None:
    failure, _ = run(node, ["/nonexistent/kubectl", "drain"], timeout=5)
    assert (
        failure == "/nonexistent/kubectl could not start: [Errno 2] No such file or directory: '/nonexistent/kubectl'"
    )


def test_lines_are_cut_at_the_limit_and_split_across_reads() -> None:
    cutter = LineCutter(limit=5)
    assert cutter.feed(b"ab") == []
    assert cutter.feed(b"c\r\n1234567") == ["abc", "12345 [line cut]"]
    assert cutter.feed(b"89\nok\n\nend") == ["ok", ""]
    assert cutter.flush() == ["end"]
    assert cutter.feed(b"\xff\n") == ["\ufffd"]


def test_the_reason_names_what_was_killed_and_what_the_hook_said_last() -> None:
    killed = [{"pid": pid, "command": f"sleep {pid}", "signal": "TERM"} for pid in range(1, 8)]
    assert hook_failure("sh", 1.5, HookRun(ended="timeout", killed=killed, more=3)) == (
        "sh timed out after 1.5 s (gpunode_hook_timeout) and was killed with what it started: "
        "1 sleep 1, 2 sleep 2, 3 sleep 3, 4 sleep 4, 5 sleep 5 and 5 more"
    )
    assert (
        hook_failure("sh", 1, HookRun(exit=2, seconds=0.25, last_lines=["a", " b ", ""]))
        == "sh exited 2 after 0.2 s: b"
    )
    assert hook_failure("sh", 1, HookRun(exit=2)) == "sh exited 2 after 0.0 s: no output"
    assert hook_failure("sh", 1, HookRun(exit=0, killed=killed)) is None  # leftovers ended, and logged


def test_a_killed_command_is_named_without_its_control_characters() -> None:
    killed = [{"pid": 9, "command": "sh -c 'x\x1b[2J\ny\x9b'", "signal": "KILL"}]
    assert hook_failure("sh", 2, HookRun(ended="timeout", killed=killed)) == (
        "sh timed out after 2 s (gpunode_hook_timeout) and was killed with what it started: "
        "9 sh -c 'x<U+001B>[2J<U+000A>y<U+009B>'"
    )
