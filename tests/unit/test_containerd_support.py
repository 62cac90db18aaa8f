"""containerd's support windows (pure): a line past its end is a warning in the plan and the readiness report."""

from __future__ import annotations

from datetime import date

import pytest

from pyinfra_gpunode.containerd_files import parse_config_file, version_skew_files
from pyinfra_gpunode.containerd_support import END_OF_SUPPORT, support_warning
from pyinfra_gpunode.versions import parse_containerd_version

TODAY = date(2026, 12, 7)


def version(raw: str):
    parsed = parse_containerd_version(f"containerd github.com/containerd/containerd/v2 {raw} abc")
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("raw", "ended"),
    [
        ("1.6.20", "2025-08-23"),
        ("1.7.24", "2026-09-30"),
        ("2.1.9", "2026-07-03"),
        ("2.2.5", "2026-11-06"),
        ("1.4.13", None),  # older than the table: ended, no date known
    ],
)
def test_a_line_past_its_end_is_named_with_the_date_and_the_supported_lines(raw: str, ended: str | None) -> None:
    warning = support_warning(version(raw), TODAY)
    assert warning is not None
    assert warning.startswith(f"containerd {raw}: the {'.'.join(raw.split('.')[:2])} line is past its end of support")
    assert (f"since {ended}" in warning) is (ended is not None)
    assert "supported lines: 2.0, 2.3, 2.4" in warning
    assert warning.endswith("this is a warning, not a refusal")


@pytest.mark.parametrize("raw", ["2.0.7", "2.3.4", "2.4.0-dev", "2.5.0", "3.0.0"])
def test_a_supported_or_newer_line_gets_no_warning(raw: str) -> None:
    assert support_warning(version(raw), TODAY) is None


def test_the_end_day_itself_is_still_supported() -> None:
    assert support_warning(version("2.2.0"), END_OF_SUPPORT[(2, 2)]) is None
    assert support_warning(version("2.2.0"), date(2026, 11, 7)) is not None
    assert support_warning(None, TODAY) is None


def test_containerds_version_skew_error_is_given_its_files() -> None:
    files = [
        parse_config_file("/etc/containerd/config.toml", "version = 2\n"),
        parse_config_file("/etc/containerd/conf.d/10-registry.toml", "version = 2\n"),
        parse_config_file("/etc/containerd/conf.d/99-nvidia.toml", "version = 3\n"),
    ]
    error = "containerd: drop-in config version 3 higher than root config version 2"
    said = version_skew_files(error, files)
    assert said is not None
    assert said.startswith("/etc/containerd/conf.d/99-nvidia.toml has a version above /etc/containerd/config.toml's")
    assert version_skew_files("containerd: open /x: no such file or directory", files) is None


def test_the_nodes_version_text_is_shown_printable() -> None:
    parsed = parse_containerd_version("containerd github.com/containerd/containerd 1.7.24\x1b[2J x")
    warning = support_warning(parsed, TODAY)
    assert warning is not None and warning.startswith("containerd 1.7.24<U+001B>[2J: the 1.7 line")
