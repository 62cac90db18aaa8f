"""CDI specs are parsed within limits: a hostile spec is that file's error, never a hang or a crash."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pyinfra_gpunode import shell
from pyinfra_gpunode.facts.cdi import (
    _READ_SPECS,
    LIMITS,
    MARKER,
    NOT_UTF8,
    TOO_LARGE,
    CdiSpecs,
    NodeBudget,
    YamlLimits,
    parse_printed,
    parse_spec,
)

FIXTURES = Path(__file__).resolve().parents[1] / "facts" / "cdi.CdiSpecs"
PATH = "/etc/cdi/nvidia.yaml"
# "Billion laughs": 436 bytes whose aliases stand for 10^9 strings.
ALIAS_BOMB = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


@contextmanager
def seconds(limit: int) -> Iterator[None]:
    """Fail the test (instead of hanging the suite) when the block runs longer than ``limit`` seconds."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"still parsing after {limit} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def error(text: str, limits: YamlLimits = LIMITS) -> str | None:
    with seconds(30):
        return parse_spec(PATH, None, text, limits)["error"]


def test_alias_bomb_is_refused_naming_the_file_and_the_limit() -> None:
    assert len(ALIAS_BOMB.encode()) < 500
    found = error(ALIAS_BOMB)
    assert found is not None and found.startswith(f"{PATH} is refused unparsed: ")
    assert "more than 100 YAML aliases" in found or "more than 1000000 YAML nodes (aliases expanded)" in found


def test_aliases_within_the_limit_expand_past_the_node_limit() -> None:
    """Few aliases, but each level multiplies: the node count (aliases expanded) refuses it."""
    found = error(ALIAS_BOMB, YamlLimits(max_aliases=1000, max_nodes=10_000))
    assert found == f"{PATH} is refused unparsed: more than 10000 YAML nodes (aliases expanded) (line 5, column 8)"


def test_deep_nesting_is_a_parse_error_not_a_recursion_error() -> None:
    found = error("[" * 100_000)
    assert found == f"{PATH} is refused unparsed: collections nested deeper than 64 levels (line 1, column 65)"
    assert error("devices:\n" + "  " * 70 + "- x\n") is not None  # block style too
    mapping = "".join("  " * depth + f"k{depth}:\n" for depth in range(100))
    assert "nested deeper than 64 levels" in str(error(mapping))


def test_alias_to_its_own_collection_is_refused() -> None:
    found = error("devices: &d\n- name: all\n  self: *d\n")
    assert found == f"{PATH} is refused unparsed: alias *d refers to a collection that contains it (line 3, column 9)"


def test_oversize_and_slow_specs_are_refused() -> None:
    spec = "devices:\n- name: all\n" + "# padding\n" * 100
    assert error(spec, YamlLimits(max_bytes=1000)) == (
        f"{PATH} is refused unparsed: {len(spec)} bytes, more than the limit of 1000 bytes"
    )
    assert "parsing takes longer than 0 s" in str(error(spec, YamlLimits(max_seconds=0)))


def test_real_specs_and_a_few_aliases_still_parse() -> None:
    for fixture in sorted(FIXTURES.glob("*.json")):
        recorded = json.loads(fixture.read_text())
        assert CdiSpecs().process(recorded["output"]) == recorded["fact"], fixture.name
    shared = "env: &env [NVIDIA_VISIBLE_DEVICES=void]\ndevices:\n- name: '0'\n  env: *env\n- name: all\n  env: *env\n"
    spec = parse_spec(PATH, None, shared)
    assert spec["error"] is None and spec["devices"] == ["0", "all"]


def read_specs(*dirs: Path, limit: int = LIMITS.max_bytes) -> list[str]:
    """What the fact's node-side program prints for ``dirs`` (run here by a real ``sh``)."""
    command = shell.command(_READ_SPECS, "gpunode-cdi-specs", MARKER, TOO_LARGE, str(limit), NOT_UTF8, *map(str, dirs))
    done = subprocess.run(command, shell=True, capture_output=True, timeout=60, check=True)
    return done.stdout.decode("utf-8").splitlines()  # strictly: pyinfra's connectors decode it so


def test_a_spec_or_a_name_that_is_not_utf8_is_named_not_printed(tmp_path: Path) -> None:
    """One Latin-1 byte in a spec (or its name) would cut the controller's read of the whole node short."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "latin1.yaml").write_bytes(b"cdiVersion: 0.5.0\nkind: example.com/x\n# caf\xe9\ndevices: []\n")
    (spec_dir.joinpath("caf\udce9.yaml")).write_text("cdiVersion: 0.5.0\n", errors="surrogateescape")
    (spec_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n")
    specs = {spec["path"]: spec for spec in CdiSpecs().process(read_specs(spec_dir))}
    assert specs[f"{spec_dir}/latin1.yaml"]["error"] == (
        f"{spec_dir}/latin1.yaml is refused unread: it is not UTF-8 (CDI specs are UTF-8 YAML or JSON)"
    )
    assert specs[f"{spec_dir}/caf.yaml"]["error"] is not None  # the name less the byte that is not UTF-8
    assert specs[f"{spec_dir}/nvidia.yaml"]["devices"] == ["all"]


def test_a_nodes_specs_are_parsed_within_its_budget() -> None:
    body = ["cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:", "- name: all", ""]
    printed = [(f"/etc/cdi/spec{index}.yaml", 1, body) for index in range(5)]
    specs = parse_printed(printed, NodeBudget(max_specs=3))
    assert [spec["error"] for spec in specs[:3]] == [None] * 3
    assert specs[3]["error"] == (
        "/etc/cdi/spec3.yaml is refused unparsed: this node's CDI specs come to more than 3 specs, "
        "the most one node is read for"
    )
    size = sum(len(line) + 1 for line in body)
    assert [spec["error"] is None for spec in parse_printed(printed, NodeBudget(max_bytes=2 * size))] == [
        True, True, False, False, False,
    ]  # fmt: skip
    assert all(
        "more than 0 s of parsing" in str(spec["error"]) for spec in parse_printed(printed, NodeBudget(max_seconds=0))
    )


def test_a_spec_over_the_limit_is_not_read_from_the_node(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n")
    with (spec_dir / "huge.yaml").open("wb") as huge:
        huge.truncate(LIMITS.max_bytes + 1)  # sparse: its bytes are never printed
    output = read_specs(spec_dir, tmp_path / "absent")
    assert len(output) == 8, output  # two marker lines, the size, four lines of text and the echo
    assert output[1] == f"{TOO_LARGE} {LIMITS.max_bytes + 1}"
    specs = {spec["path"]: spec for spec in CdiSpecs().process(output)}
    assert specs[f"{spec_dir}/huge.yaml"]["error"] == (
        f"{spec_dir}/huge.yaml is refused unread: 4194305 bytes, more than the limit of 4194304 bytes"
    )
    assert specs[f"{spec_dir}/nvidia.yaml"]["error"] is None
    assert specs[f"{spec_dir}/nvidia.yaml"]["devices"] == ["all"]


@pytest.mark.parametrize("first_line", [f"{TOO_LARGE} 12 x", f"{TOO_LARGE} "])
def test_a_spec_cannot_pass_itself_off_as_too_large_with_anything_but_a_size(first_line: str) -> None:
    specs = CdiSpecs().process([f"{MARKER} 1 {PATH}", first_line])
    assert specs[0]["error"] is not None and "refused unread" not in specs[0]["error"]


def test_no_line_of_a_spec_or_its_name_passes_for_a_marker_of_the_read(tmp_path: Path) -> None:
    """A spec's text (or a file name with a newline) must not forge another spec or another part of the
    readiness read, whose parts are split at lines starting with ``@@``."""
    from pyinfra_gpunode.facts.readiness import PART

    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    forged = f"{MARKER} 1 /etc/cdi/forged.yaml\n{PART}containerd\n@@version\n"
    (spec_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n" + forged + "devices:\n- name: all\n")
    (spec_dir / f"x\n{MARKER} 1 \n.yaml").write_text("cdiVersion: 0.5.0\n")
    output = read_specs(spec_dir)
    assert [line for line in output if line.startswith("@@")] == [
        f"{MARKER} {output[0].split()[1]} {spec_dir}/nvidia.yaml"
    ]
    specs = CdiSpecs().process(output)
    assert [spec["path"] for spec in specs] == [f"{spec_dir}/nvidia.yaml"]
    assert specs[0]["error"] is not None  # the forged lines make it no valid YAML: reported, not obeyed
