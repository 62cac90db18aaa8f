"""JSON a node prints is read within limits: a deeply nested or oversized answer, or one that is no JSON
at all, is that node's named problem, never an exception that ends the run."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import FactProcessError

from pyinfra_gpunode import node_json
from pyinfra_gpunode.containerd_dump import parse_cri_start_log
from pyinfra_gpunode.facts.nvml import NvmlInfo

DEEP = "[" * 100_000 + "]" * 100_000
# containerd 1.7's CRI start line as the journal holds it (its config as escaped JSON).
START = (
    'time="2026-12-01T00:00:00Z" level=info msg="starting cri plugin" '
    'config="{\\"containerd\\":{\\"defaultRuntimeName\\":\\"runc\\",\\"runtimes\\":{\\"runc\\":{}}},'
    '\\"enableCDI\\":true}"'
)


def test_a_deep_or_large_answer_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        node_json.loads(DEEP)
    with pytest.raises(ValueError, match="more than 1048576 are not read"):
        node_json.loads('"' + "x" * (1 << 20) + '"')
    assert node_json.loads('{"a": [1]}') == {"a": [1]}


def test_nvml_printing_a_deep_answer_fails_the_node_by_name() -> None:
    with pytest.raises(FactProcessError, match="NVML query printed no JSON: JSON nested too deeply"):
        NvmlInfo().process([DEEP])


@pytest.mark.parametrize(
    "config",
    [DEEP, "not json", '[\\"a\\"]', '{\\"containerd\\":[1],\\"enableCDI\\":\\"yes\\"}'],
    ids=["deep", "not-json", "a-list", "wrong-types"],
)
def test_a_cri_start_line_with_odd_json_is_read_as_nothing_or_as_far_as_it_goes(config: str) -> None:
    line = f'time="2026-12-01T00:00:01Z" level=info msg="starting cri plugin" config="{config}"'
    found = parse_cri_start_log([START, line])
    assert found["runtimes"] in (["runc"], []), found  # the earlier line stands, or a start with nothing known
    good = parse_cri_start_log([START])
    assert good["loaded"] and good["runtimes"] == ["runc"] and good["enable_cdi"] is True
