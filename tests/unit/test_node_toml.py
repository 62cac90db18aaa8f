"""TOML from a node parsed within limits: a deep or huge file is that file's error, never a RecursionError."""

from __future__ import annotations

import tomllib

import pytest

from pyinfra_gpunode import node_toml
from pyinfra_gpunode.containerd_files import parse_config_file
from pyinfra_gpunode.facts.containerd import ContainerdConfigDump
from pyinfra_gpunode.memo import copied

# 1 KB or so each: arrays and inline tables beyond what tomllib's recursion reaches, and dotted tables it
# parses but no recursive walk after it (a deep copy, flatten) could.
ARRAYS = "version = 2\nx = " + "[" * 600 + "]" * 600 + "\n"
INLINE = "version = 2\nx = " + "{a = " * 600 + "1" + "}" * 600 + "\n"
DOTTED = "version = 2\n[" + ".".join(["k"] * 300) + "]\nx = 1\n"


@pytest.mark.parametrize("text", [ARRAYS, INLINE, DOTTED], ids=["arrays", "inline tables", "dotted tables"])
def test_a_deep_document_is_a_decode_error(text: str) -> None:
    with pytest.raises(tomllib.TOMLDecodeError, match="nested"):
        node_toml.loads(text)
    config = parse_config_file("/etc/containerd/config.toml", text)
    assert config["error"] is not None and "nested" in config["error"]


def test_a_huge_text_is_a_decode_error_and_a_real_config_parses() -> None:
    with pytest.raises(tomllib.TOMLDecodeError, match="are not read"):
        node_toml.loads("x = 1\n" + "#" * node_toml.MAX_BYTES)
    text = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n'
    assert node_toml.loads(text) == tomllib.loads(text)
    assert node_toml.depth(tomllib.loads(text)) == 7  # the document itself and six tables


def test_a_deep_dump_is_the_dumps_error() -> None:
    lines = [*ARRAYS.splitlines(), "### gpunode-stderr", "### gpunode-rc 0"]
    dump = ContainerdConfigDump().process(lines)
    assert dump["summary"] is None and dump["error"] is not None and "nested too deeply" in dump["error"]


def test_a_text_parsed_again_is_a_copy_of_the_first_parse() -> None:
    text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n'
    first = node_toml.loads(text)
    first["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] = "changed by a caller"
    second = node_toml.loads(text)
    assert second["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "runc"
    assert text in node_toml._parsed  # parsed once
    deep = "x = " + "[" * 200 + "]" * 200 + "\n"
    for _ in range(2):  # a refused text is refused each time, never cached
        with pytest.raises(tomllib.TOMLDecodeError):
            node_toml.loads(deep)
    assert deep not in node_toml._parsed


def test_the_cache_holds_only_small_texts_and_a_bounded_number() -> None:
    big = "x = '" + "y" * (node_toml.CACHED_BYTES + 1) + "'\n"
    node_toml.loads(big)
    assert big not in node_toml._parsed
    for index in range(node_toml.CACHED_TEXTS + 5):
        node_toml.loads(f"n = {index}\n")
    assert len(node_toml._parsed) <= node_toml.CACHED_TEXTS


def test_a_copy_shares_no_table_or_array_with_the_parsed_text() -> None:
    """Each caller changes its own copy: tables and arrays, however nested, are new; values are equal."""
    text = 'a = [1, [2, {x = 3}]]\n[t.u]\nd = 1979-05-27T07:32:00Z\nday = 1979-05-27\ns = "v"\n'
    first = node_toml.loads(text)
    first["a"][1][1]["x"] = 99
    first["t"]["u"]["s"] = "changed"
    first["a"].append(4)
    second = node_toml.loads(text)
    assert second == tomllib.loads(text)
    copy = copied(second)
    assert copy == second and copy["t"] is not second["t"] and copy["a"][1] is not second["a"][1]
    assert copied({"kept": (1, [2])})["kept"] == (1, [2])  # anything else: deep-copied
