"""Whether the module DKMS built for a kernel will load there: version, vermagic, and the signature Secure
Boot asks for."""

from __future__ import annotations

from pyinfra_gpunode.built_module import BuiltModule, built_modules, module_problem

K = "6.12.117+deb13-amd64"
VERMAGIC = f"{K} SMP preempt mod_unload modversions"
SIGNER = "DKMS module signing key (2B:61:7E:5C)"


def module(**changes: object) -> BuiltModule:
    fields: dict[str, object] = {"kernel": K, "version": "550.163.01", "vermagic": VERMAGIC, "signer": None,
                                 "next_boot": False}  # fmt: skip
    fields.update(changes)
    return BuiltModule(**fields)  # type: ignore[arg-type]


def test_a_module_of_the_driver_built_for_its_kernel_loads() -> None:
    assert module_problem(module(), "550.163.01", secure_boot=False) == ""
    assert module_problem(module(signer=SIGNER), "550.163.01", secure_boot=True) == ""


def test_no_module_or_another_version_names_the_kernel_and_what_was_found() -> None:
    missing = module_problem(module(version=None, next_boot=True), "550.163.01", secure_boot=False)
    assert f"DKMS built no nvidia 550.163.01 module for kernel {K}, the kernel this node boots next" in missing
    assert "finds none" in missing
    stale = module_problem(module(version="550.127.05"), "550.163.01", secure_boot=False)
    assert "finds version '550.127.05'" in stale


def test_a_module_built_for_another_kernel_is_refused_naming_its_vermagic() -> None:
    other = module_problem(module(vermagic="6.12.48+deb13-amd64 SMP preempt"), "550.163.01", secure_boot=False)
    assert f"module for kernel {K} was built for kernel '6.12.48+deb13-amd64'" in other
    assert "built for kernel unknown (its vermagic: none)" in module_problem(module(vermagic=None), "550.163.01", False)


def test_unsigned_is_refused_where_secure_boot_is_on_or_unknown() -> None:
    on = module_problem(module(), "550.163.01", secure_boot=True)
    assert "is not signed, and Secure Boot is on" in on and "mokutil --import /var/lib/dkms/mok.pub" in on
    unknown = module_problem(module(), "550.163.01", secure_boot=None)
    assert "Secure Boot is unknown (taken as on)" in unknown


def test_what_the_node_says_reaches_the_message_quoted_and_cut() -> None:
    hostile = "6.12.48\x1b[2J" + "x" * 500
    problem = module_problem(module(vermagic=hostile), "550.163.01", secure_boot=False)
    assert "\x1b" not in problem and len(problem) < 600


def test_the_running_and_the_next_boot_kernels_module() -> None:
    node = {
        "kernel": "6.12.48+deb13-amd64", "built_module_version": "550.127.05",
        "built_module_vermagic": "6.12.48+deb13-amd64 SMP", "built_module_signer": None,
        "boot_kernel": K, "boot_module_version": "550.163.01", "boot_module_vermagic": VERMAGIC,
        "boot_module_signer": SIGNER,
    }  # fmt: skip
    found = built_modules(node)
    assert found[K] == BuiltModule(K, "550.163.01", VERMAGIC, SIGNER, True)
    assert found["6.12.48+deb13-amd64"].version == "550.127.05" and not found["6.12.48+deb13-amd64"].next_boot
    assert list(built_modules({**node, "boot_kernel": "6.12.48+deb13-amd64"})) == ["6.12.48+deb13-amd64"]
