"""Driver version parsing and comparison."""

import pytest

from pyinfra_gpunode.driver_versions import (
    branch_of,
    parse_proc_version,
    same_driver,
    upstream_version,
    version_from_library,
    version_key,
)

PROC = {
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  384.98  Thu Oct 26 15:16:01 PDT 2017": (
        "384.98",
        "proprietary",
    ),
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  "
    "(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024": ("565.57.01", "open"),
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  525.60.11  Release Build  "
    "(archlinux-builder@localhost)  ": (
        "525.60.11",
        "open",
    ),
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  35.3.1  Release Build  "
    "(buildbrain@mobile-u64-6289-d7000)  Sun Mar 19 08:09:33 PDT 2023": ("35.3.1", "open"),
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.173.02  Tue Jun 23 08:38:17 UTC 2026\n"
    "GCC version:  gcc version 14.2.0": ("580.173.02", "proprietary"),
}


@pytest.mark.parametrize(("text", "expected"), PROC.items())
def test_proc_version_both_layouts(text: str, expected: tuple[str, str]) -> None:
    assert parse_proc_version(text) == expected


def test_proc_version_garbage() -> None:
    assert parse_proc_version("") is None
    assert parse_proc_version("NVRM version: something else 1.2.3") is None


def test_two_and_three_part_versions() -> None:
    assert version_key("510.54") == (510, 54)
    assert version_key("550.163.01") == (550, 163, 1)
    assert version_key("595.80") < version_key("595.84") < version_key("595.84.1")
    assert branch_of("580.126.20") == "580"
    with pytest.raises(ValueError, match="'580'"):
        version_key("580")


def test_same_driver_by_prefix() -> None:
    assert same_driver("535.161", "535.161.07")  # nvidia-smi's "NVML library version: 535.161"
    assert same_driver("550.163.01", "550.163.01")
    assert not same_driver("550.163.01", "550.163.02")
    assert not same_driver("510.73.05", "515.48.07")
    assert not same_driver(None, "550.163.01")
    assert not same_driver("550.163.01", "garbage")


def test_library_and_package_versions() -> None:
    assert version_from_library("/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.550.163.01") == "550.163.01"
    assert version_from_library("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") is None
    assert upstream_version("580.126.20-0ubuntu0.24.04.2") == "580.126.20"
    assert upstream_version("535.216.03-2~bpo12+1") == "535.216.03"
    assert upstream_version("1:2.3") == "2.3"
