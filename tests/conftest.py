"""Shared pytest setup for pyinfra-gpunode's tests.

pytest also loads this file when ``pytest --pyargs pyinfra_gpunode.verify`` starts in the checkout,
where a plain install has no test extras: the pyinfra-testing patch applies only where it is installed.
"""

import importlib.util

pytest_plugins = ["tests.fleet.plugin", "tests.packaging"]

if importlib.util.find_spec("pyinfra_testing") is not None:
    from pyinfra_testing import util as _testing_util

    def _fake_fact_bool(self: _testing_util.FakeFact) -> bool:
        # pyinfra-testing wraps fact values in FakeFact, which has no __bool__, so
        # ``if not host.get_fact(X)`` would always be False under test.
        return bool(self.data)

    _testing_util.FakeFact.__bool__ = _fake_fact_bool  # type: ignore[attr-defined]
