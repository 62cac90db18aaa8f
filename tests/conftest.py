"""Shared pytest setup for pyinfra-gpunode's tests.

pytest also loads this file when ``pytest --pyargs pyinfra_gpunode.verify`` starts in the checkout,
where a plain install has no test extras: the pyinfra-testing patch applies only where it is installed.
"""

import importlib.util

import pytest

pytest_plugins = ["tests.fleet.plugin", "tests.packaging"]

if importlib.util.find_spec("pyinfra_testing") is not None:
    from pyinfra_testing import util as _testing_util

    def _fake_fact_bool(self: _testing_util.FakeFact) -> bool:
        # pyinfra-testing wraps fact values in FakeFact, which has no __bool__, so
        # ``if not host.get_fact(X)`` would always be False under test.
        return bool(self.data)

    _testing_util.FakeFact.__bool__ = _fake_fact_bool  # type: ignore[attr-defined]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the tiers honest: ``scripts/test.sh --fast`` deselects ``fleet`` and ``vm``, so a test that
    boots test hosts must carry one of those marks, and a chroot test must not hide among them."""
    for item in items:
        if not item.nodeid.startswith("tests/"):
            continue
        boots = "fleet_factory" in item.fixturenames
        marks = {name for name in ("fleet", "vm", "chroot") if item.get_closest_marker(name)}
        if boots and not marks & {"fleet", "vm"}:
            raise pytest.UsageError(f"{item.nodeid} boots test hosts (fleet_factory): mark it fleet or vm")
        if not boots and "fleet" in marks and "trixie_root" in item.fixturenames:
            raise pytest.UsageError(f"{item.nodeid} boots no host: mark it chroot, not fleet")
