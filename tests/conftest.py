"""Shared pytest setup for pyinfra-gpunode's tests.

pytest also loads this file when ``pytest --pyargs pyinfra_gpunode.verify`` starts in the checkout,
where a plain install has no test extras: the pyinfra-testing patch applies only where it is installed.
"""

import importlib.util
import signal

import pytest

pytest_plugins = ["tests.fleet.plugin", "tests.packaging", "tests.claims"]

if importlib.util.find_spec("pyinfra_testing") is not None:
    from pyinfra_testing import util as _testing_util

    def _fake_fact_bool(self: _testing_util.FakeFact) -> bool:
        # pyinfra-testing wraps fact values in FakeFact, which has no __bool__, so
        # ``if not host.get_fact(X)`` would always be False under test.
        return bool(self.data)

    _testing_util.FakeFact.__bool__ = _fake_fact_bool  # type: ignore[attr-defined]


# The suite's shards, which ``scripts/test.sh`` runs side by side: the tests of the session-long fleets
# (``fleet``, the harness), those of the qemu host (``vm_fleet``), those of the fleets a module boots for
# itself, and the rest (unit, fixture, real-binary and chroot tests, which boot no host). A process may
# run several (``--shard fast,vm,modules``); with ``--claim-modules`` (tests/claims.py) processes share a
# shard a module at a time, their fleets kept within the machine's budget (tests/fleet/budget.py).
SHARDS = ("session", "vm", "modules", "fast")
# The longest module fleets, which the process owning the modules shard runs first: the processes taking
# its modules when done with their own start from its last module, and find short ones there.
LONGEST_FIRST = ("tests/integration/test_rollout_turns_fleet.py", "tests/integration/test_rollout_batches_fleet.py")


def shard_list(text: str) -> tuple[str, ...]:
    """``--shard``'s value: one shard or several, comma-separated, each once."""
    shards = tuple(text.split(","))
    unknown = [shard for shard in shards if shard not in SHARDS]
    if unknown or not shards or len(set(shards)) != len(shards):
        raise pytest.UsageError(f"--shard takes one or more of {', '.join(SHARDS)}, comma-separated, got {text!r}")
    return shards


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard", default=None,
        help="run one shard of the suite, or several comma-separated: session (tests of the shared fleets), vm "
        "(tests of the qemu host), modules (tests of the fleets a module boots for itself) or fast (every test "
        "that boots no host); the first shard's tests run first, a later shard's a module at a time from its "
        "last module",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """A shard is a background job of ``scripts/test.sh``, started with SIGINT ignored: it takes SIGINT again
    (so that an interrupt, which the script passes on, ends it with its fleets and mounts torn down)."""
    shard = config.getoption("--shard")
    if shard is not None:
        shard_list(shard)
    if shard is not None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def shard_of(item: pytest.Item) -> str:
    """The shard a test belongs to: ``vm`` where it is marked ``vm``; ``fast`` unless it is marked ``fleet``;
    ``modules`` where its module defines a ``fleet`` fixture of its own; else ``session``."""
    if item.get_closest_marker("vm"):
        return "vm"
    if not item.get_closest_marker("fleet"):
        return "fast"
    module = getattr(item, "module", None)
    return "modules" if module is not None and "fleet" in vars(module) else "session"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tiers honest: ``scripts/test.sh --fast`` deselects ``fleet`` and ``vm``, so a test that
    boots test hosts must carry one of those marks, and a chroot test must not hide among them. With
    ``--shard``, only those shards' tests run (``in_shard_order``)."""
    _check_tiers(items)
    shard = config.getoption("--shard")
    if shard is not None:
        from tests.claims import CLAIM_GROUP  # here: imported before pytest_plugins, it would not be rewritten

        selected = in_shard_order(items, shard_list(shard))
        for item in selected:
            item.stash[CLAIM_GROUP] = shard_of(item)
        chosen = {id(item) for item in selected}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen])
        items[:] = selected


def in_shard_order(items: list[pytest.Item], shards: tuple[str, ...]) -> list[pytest.Item]:
    """The tests of ``shards``, a module at a time, tests in their order within a module: the first shard's
    modules in their order (those in ``LONGEST_FIRST`` first), then each later shard's from its last module
    (a process that takes another's modules when done with its own starts where that one arrives last). A
    first ``vm`` shard (few, long tests, begun before the rest so that nothing waits on them at the end) makes
    the next one the process's own too: its modules in their order."""
    owned = 2 if shards[0] == "vm" else 1
    ordered: list[pytest.Item] = []
    for position, shard in enumerate(shards):
        modules: dict[str, list[pytest.Item]] = {}
        for item in items:
            if shard_of(item) == shard:
                modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        if position < owned:
            rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
            names = sorted(modules, key=lambda name: rank.get(name, len(rank)))
        else:
            names = list(reversed(modules))
        ordered += [item for name in names for item in modules[name]]
    return ordered


def _check_tiers(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.nodeid.startswith("tests/"):
            continue
        boots = "fleet_factory" in item.fixturenames
        marks = {name for name in ("fleet", "vm", "chroot") if item.get_closest_marker(name)}
        if boots and not marks & {"fleet", "vm"}:
            raise pytest.UsageError(f"{item.nodeid} boots test hosts (fleet_factory): mark it fleet or vm")
        if not boots and "fleet" in marks and "trixie_root" in item.fixturenames:
            raise pytest.UsageError(f"{item.nodeid} boots no host: mark it chroot, not fleet")
