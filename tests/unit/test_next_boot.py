"""The nvidia module after the next reboot: said where the kernel the node boots next has no module, or one
of another version than the userspace library; nothing where no other kernel is next."""

from __future__ import annotations

from pyinfra_gpunode.next_boot import module_warning

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
