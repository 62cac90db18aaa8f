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
# (``fleet``, ``vm_fleet``, the harness), those of the fleets a module boots for itself, and the rest
# (unit, fixture, real-binary and chroot tests, which boot no host). They share no fleet, so no shard
# waits for another's fleet lock, and at most one session fleet and one module fleet are up at once.
SHARDS = ("session", "modules", "fast")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard", choices=SHARDS, default=None,
        help="run one shard of the suite: session (tests of the shared fleets), modules (tests of the fleets "
        "a module boots for itself) or fast (every test that boots no host)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """A shard is a background job of ``scripts/test.sh``, started with SIGINT ignored: it takes SIGINT again
    (so that an interrupt, which the script passes on, ends it with its fleets and mounts torn down)."""
    if config.getoption("--shard") and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def shard_of(item: pytest.Item) -> str:
    """The shard a test belongs to: ``fast`` unless it is marked ``fleet`` or ``vm``; ``modules`` where its
    module defines a ``fleet`` fixture of its own; else ``session``."""
    if not (item.get_closest_marker("fleet") or item.get_closest_marker("vm")):
        return "fast"
    module = getattr(item, "module", None)
    return "modules" if module is not None and "fleet" in vars(module) else "session"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tiers honest: ``scripts/test.sh --fast`` deselects ``fleet`` and ``vm``, so a test that
    boots test hosts must carry one of those marks, and a chroot test must not hide among them. With
    ``--shard``, only that shard's tests run."""
    _check_tiers(items)
    shard = config.getoption("--shard")
    if shard:
        deselected = [item for item in items if shard_of(item) != shard]
        items[:] = [item for item in items if shard_of(item) == shard]
        config.hook.pytest_deselected(items=deselected)


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
