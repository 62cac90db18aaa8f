"""Shared pytest setup for pyinfra-gpunode's tests."""

from pyinfra_testing import util as _testing_util

pytest_plugins = ["tests.fleet.plugin"]


def _fake_fact_bool(self: _testing_util.FakeFact) -> bool:
    # pyinfra-testing wraps fact values in FakeFact, which has no __bool__, so
    # ``if not host.get_fact(X)`` would always be False under test.
    return bool(self.data)


_testing_util.FakeFact.__bool__ = _fake_fact_bool  # type: ignore[attr-defined]
