"""Two (or more) pytest processes sharing one selection of tests, a module at a time: ``--claim-modules DIR``.

Each process collects the same tests and runs only the modules it claims first, by creating a file named
after the module in ``DIR`` (``O_EXCL``: exactly one process gets each); a process claims its next module
when it reaches the last test of the one it runs, so the modules go to whichever process is free, and the
slow ones spread without a table of durations. Module fixtures are set up by the one process that runs
the module; session fixtures by each process that needs them. ``scripts/test.sh --fast`` runs two.

Processes may select different tests (``--shard``): a test's claim group (``CLAIM_GROUP`` in its stash,
its shard) is part of what is claimed, so that a module holding tests of two groups is claimed once per
group, and no process claims a module for its own tests while another selected the module's other tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--claim-modules", metavar="DIR", default=None,
        help="run only the test modules this process claims first in DIR; processes given one DIR share the "
        "modules between them",
    )  # fmt: skip


CLAIM_GROUP = pytest.StashKey[str]()


def claim(directory: Path, module: str) -> bool:
    """Whether this process is the first to claim ``module`` (a claim group's module) in ``directory``."""
    try:
        os.close(os.open(directory / module.replace("/", "%"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _module(item: pytest.Item) -> str:
    """What the process claims to run ``item``: its module, after its claim group where it has one."""
    module = item.nodeid.split("::", 1)[0]
    group = item.stash.get(CLAIM_GROUP, None)
    return module if group is None else f"{group}:{module}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """pytest's own loop over the modules this process claims (``nextitem`` is the next test it runs)."""
    directory = session.config.getoption("--claim-modules")
    if directory is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    modules: dict[str, list[pytest.Item]] = {}
    for item in session.items:
        modules.setdefault(_module(item), []).append(item)
    waiting = iter(modules)

    def next_claimed() -> list[pytest.Item] | None:
        return next((modules[name] for name in waiting if claim(Path(directory), name)), None)

    group = next_claimed()
    while group is not None:
        following = None
        for index, item in enumerate(group):
            if index + 1 < len(group):
                nextitem: pytest.Item | None = group[index + 1]
            else:
                following = next_claimed()
                nextitem = following[0] if following else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        group = following
    return True
