"""gpunode/memo.py: a pure function's results kept by content, each caller given its own copy."""

from __future__ import annotations

from typing import Any

import pytest

from pyinfra_gpunode import memo
from pyinfra_gpunode.memo import by_content


def counted() -> tuple[list[Any], Any]:
    calls: list[Any] = []

    @by_content
    def parsed(text: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        calls.append(text)
        if text == "bad":
            raise ValueError("bad text")
        return {"text": text, "options": options, "items": [1, 2]}

    return calls, parsed


def test_the_same_content_is_worked_out_once_and_each_caller_gets_its_own_copy() -> None:
    calls, parsed = counted()
    first = parsed("a", {"x": 1})
    first["items"].append(3)  # a caller's change reaches no other caller
    second = parsed("a" + "", options={"x": 1})
    assert calls == ["a", "a"]  # keyword and positional calls are keyed apart: a miss, never a wrong hit
    third = parsed("a", {"x": 1})
    assert calls == ["a", "a"] and second == third == {"text": "a", "options": {"x": 1}, "items": [1, 2]}
    assert second is not third and second["items"] is not third["items"]


@pytest.mark.parametrize("other", [{"x": 1.0}, {"x": True}, {"x": "1"}, {"x": 1, "y": None}, None])
def test_values_that_differ_are_never_taken_for_each_other(other: dict[str, Any] | None) -> None:
    calls, parsed = counted()
    parsed("a", {"x": 1})
    assert parsed("a", other)["options"] == other
    assert len(calls) == 2


def test_an_exception_is_raised_again_on_each_call_never_kept() -> None:
    calls, parsed = counted()
    for _ in range(2):
        with pytest.raises(ValueError, match="bad text"):
            parsed("bad")
    assert calls == ["bad", "bad"]


def test_large_arguments_are_worked_out_each_time_and_the_kept_results_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memo, "KEPT_KEY_CHARACTERS", 100)
    monkeypatch.setattr(memo, "KEPT_RESULTS", 3)
    calls, parsed = counted()
    parsed("x" * 200)
    parsed("x" * 200)
    assert len(calls) == 2
    for text in ["a", "b", "c", "d", "a"]:
        parsed(text)
    assert calls[2:] == ["a", "b", "c", "d", "a"]  # full at three: all dropped, "a" worked out again
    parsed("d")
    assert calls[-1] == "a"


def test_a_key_leaves_out_what_only_bounds_the_work() -> None:
    """A time limit that differs on each call does not keep the same text from being worked out once."""
    calls: list[str] = []

    @by_content(key=lambda text, seconds: text)
    def parsed(text: str, seconds: float) -> list[str]:
        calls.append(text)
        return [text]

    assert parsed("a", 1.5) == parsed("a", 0.25) == ["a"]
    assert calls == ["a"]


def test_a_shared_result_is_one_read_only_object_whose_copies_are_ordinary() -> None:
    import copy
    import json

    calls: list[str] = []

    @by_content(shared=True)
    def parsed(text: str) -> dict[str, Any]:
        calls.append(text)
        return {"plugins": {"cri": {"runtimes": ["runc"]}}, "version": 2}

    first, second = parsed("a"), parsed("a")
    assert first is second and calls == ["a"]
    assert isinstance(first, dict) and isinstance(first["plugins"]["cri"]["runtimes"], list)
    changes = [
        lambda: first.update(version=3),
        lambda: first["plugins"].setdefault("nri", {}),
        lambda: first["plugins"]["cri"].__setitem__("x", 1),
        lambda: first["plugins"]["cri"]["runtimes"].append("nvidia"),
        lambda: first.pop("version"),
        lambda: first["plugins"]["cri"]["runtimes"].sort(),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="shared by every node"):
            change()
    assert parsed("a") == {"plugins": {"cri": {"runtimes": ["runc"]}}, "version": 2}
    for made in (copy.copy(first), copy.deepcopy(first), memo.copied(first), dict(first)):
        assert type(made) is dict and made == first
        made["version"] = 3
    deep = copy.deepcopy(first)
    deep["plugins"]["cri"]["runtimes"].append("nvidia")  # a deep copy is changeable all the way down
    assert first["plugins"]["cri"]["runtimes"] == ["runc"]
    assert json.loads(json.dumps(first)) == first
