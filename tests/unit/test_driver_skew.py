"""The nvidia module after the next reboot: said where the kernel the node boots next has no module, or one
of another version than the userspace library; nothing where no other kernel is next."""

from __future__ import annotations

from pyinfra_gpunode.driver_skew import module_warning
from pyinfra_gpunode.driver_versions import mixed_userspace

RUNNING, NEXT = "6.12.48+deb13-amd64", "6.12.57+deb13-amd64"


def test_no_module_for_the_next_kernel_is_named_with_the_fix() -> None:
    warning = module_warning(RUNNING, NEXT, True, False, None, "550.163.01")
    assert warning is not None
    assert warning.startswith(f"the nvidia module is built for the running kernel {RUNNING} but not for {NEXT}")
    assert f"`dkms autoinstall -k {NEXT}`" in warning


def test_a_module_of_another_version_for_the_next_kernel_is_named() -> None:
    warning = module_warning(RUNNING, NEXT, True, True, "535.247.01", "550.163.01")
    assert warning is not None and "is 535.247.01 but the userspace library is 550.163.01" in warning
    assert module_warning(RUNNING, NEXT, True, True, "550.163.01", "550.163.01") is None
    assert module_warning(RUNNING, NEXT, True, True, "550.163", "550.163.01") is None  # the same build


def test_nothing_is_said_without_another_kernel_next_or_without_any_module() -> None:
    assert module_warning(RUNNING, RUNNING, True, False, None, "550.163.01") is None
    assert module_warning(RUNNING, None, True, False, None, "550.163.01") is None
    assert module_warning(RUNNING, NEXT, False, False, None, None) is None  # the module link names it


def test_a_kernel_name_with_control_characters_is_shown_printable() -> None:
    warning = module_warning(RUNNING, "6.12\x1b[31m", True, False, None, None)
    assert warning is not None and "\x1b" not in warning


def test_userspace_libraries_of_two_driver_versions_are_named() -> None:
    packages = {
        "libnvidia-ml1": {"version": "550.163.01-2", "held": True},
        "libcuda1": {"version": "535.247.01-1~deb12u1", "held": False},
        "libnvidia-ptxjitcompiler1": {"version": "550.163.01-2", "held": True},
        "libnvidia-container1": {"version": "1.17.8-1", "held": False},  # the toolkit's: its own version
        "libcudart12": {"version": "12.4.127-1", "held": False},  # CUDA's: its own version
        "nvidia-modprobe": {"version": "550.54.14-1", "held": False},  # not a library of the set
        "libnvidia-egl-wayland1": {"version": "1:1.1.13-1", "held": False},
    }
    assert mixed_userspace(packages) == (
        "the NVIDIA userspace libraries are of 2 driver versions (535.247.01: libcuda1; 550.163.01: "
        "libnvidia-ml1, libnvidia-ptxjitcompiler1): a program that loads two of them fails; install one driver's "
        "whole set and hold it"
    )
    del packages["libcuda1"]
    assert mixed_userspace(packages) is None
    ubuntu = {"libnvidia-compute-580": {"version": "580.126.20-0ubuntu0.24.04.2", "held": True},
              "libnvidia-gl-580": {"version": "580.126.20-0ubuntu0.24.04.2", "held": True}}  # fmt: skip
    assert mixed_userspace(ubuntu) is None


def test_package_names_read_from_the_node_are_shown_printable() -> None:
    from pyinfra_gpunode.driver_skew import skew_warnings

    host = {
        "kernel": RUNNING, "boot_kernel": None, "module_built": True, "boot_module_built": False,
        "boot_module_version": None, "driver": {"userspace_version": "550.163.01"},
        "packages": {"libnvidia-ml1": {"version": "550.163.01-2"}, "libcuda1\x1b[2J": {"version": "535.247.01-1"}},
    }  # fmt: skip
    ((what, warning),) = skew_warnings(host)
    assert what == "userspace" and "\x1b" not in warning and "libcuda1" in warning


def test_a_module_the_kernel_will_refuse_at_the_next_boot_is_named() -> None:
    from pyinfra_gpunode.driver_skew import refused_at_boot

    host = {
        "kernel": RUNNING, "boot_kernel": NEXT, "secure_boot": True,
        "built_module_version": "550.163.01", "built_module_vermagic": f"{RUNNING} SMP", "built_module_signer": None,
        "boot_module_version": "550.163.01", "boot_module_vermagic": f"{NEXT} SMP", "boot_module_signer": None,
    }  # fmt: skip
    warning = refused_at_boot(host)
    assert warning is not None and warning.startswith(
        f"after a reboot: the nvidia 550.163.01 module DKMS built for "
        f"kernel {NEXT}, the kernel this node boots next, is not signed"
    )
    assert refused_at_boot({**host, "boot_module_signer": "DKMS module signing key (2B:61)"}) is None
    assert refused_at_boot({**host, "secure_boot": None}) is None  # only unknown: not second-guessed
    other = refused_at_boot({**host, "secure_boot": False, "boot_module_vermagic": f"{RUNNING} SMP"})
    assert other is not None and f"was built for kernel '{RUNNING}'" in other
    # no module, or no vermagic read: nothing said here
    assert (
        refused_at_boot({**host, "boot_module_version": None, "boot_kernel": None, "built_module_vermagic": None})
        is None
    )
