"""Which driver packages a host gets."""

import pytest

from pyinfra_gpunode.driver_plan import (
    NO_DRIVER,
    DriverRequest,
    DriverRequestError,
    HostInfo,
    check_request,
    foreign_driver,
    plan_driver,
    preinstalled_driver,
    previous_driver,
    previous_set,
    resolve_source,
    wanted_names,
)
from pyinfra_gpunode.toolkit_plan import ToolkitRequestError, check_toolkit, newest_common_version, toolkit_source

K = "6.8.0-45-generic"
UBUNTU = HostInfo("ubuntu", "24.04", K, "amd64", secure_boot=True)
DEBIAN = HostInfo("debian", "13", "6.12.117+deb13-amd64", "amd64", secure_boot=False)
LRM = {
    "nvidia-headless-no-dkms-580-server": ["580.126.20-0ubuntu0.24.04.2", "580.95.05-0ubuntu0.24.04.1"],
    "nvidia-utils-580-server": ["580.126.20-0ubuntu0.24.04.2", "580.95.05-0ubuntu0.24.04.1"],
    f"linux-objects-nvidia-580-server-{K}": ["6.8.0-45.45+1"],
    f"linux-modules-nvidia-580-server-{K}": ["6.8.0-45.45+1"],
    f"linux-signatures-nvidia-{K}": ["6.8.0-45.45+1"],
    "nvidia-dkms-580-server": ["580.126.20-0ubuntu0.24.04.2"],
    f"linux-headers-{K}": ["6.8.0-45.45"],
}
NO_LRM = {k: v for k, v in LRM.items() if not k.startswith(("linux-objects-", "linux-modules-", "linux-signatures-"))}


def req(**kwargs: object) -> DriverRequest:
    return check_request(DriverRequest(**kwargs))  # type: ignore[arg-type]


def debian_550(*kernels: str) -> dict[str, list[str]]:
    """Debian 13's 550 packages as its index offers them, with the headers of ``kernels``."""
    names = ("nvidia-driver", "firmware-nvidia-gsp", "libcuda1", "nvidia-smi", "nvidia-kernel-dkms")
    headers = {f"linux-headers-{kernel}": [kernel.split("+", 1)[0] + "-1"] for kernel in kernels}
    return {**{name: ["550.163.01-2"] for name in names}, "nvidia-persistenced": ["550.163.01-1"], **headers}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"branch": "58"}, "three digits"),
        ({"branch": "999"}, "unknown driver branch '999'"),
        ({"version": "580"}, "full driver version"),
        ({"branch": "580", "version": "550.163.01"}, "not on branch '580'"),
        ({"branch": "580", "flavor": "desktop"}, "flavor must be one of"),
    ],
)
def test_bad_requests_name_the_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(DriverRequestError, match=message) as raised:
        req(**kwargs)
    assert raised.value.argument in kwargs


# The H200 sample: open module 580.159.04 installed outside apt, library under /usr/local/nvidia.
H200 = {
    "loaded": True, "kernel_module_version": "580.159.04", "module_flavor": "open",
    "userspace_version": "580.159.04", "mismatch": False, "nvidia_smi_ok": True,
    "library": "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", "library_package": None,
}  # fmt: skip


def test_auto_source_follows_the_request_then_the_loaded_driver() -> None:
    assert resolve_source("auto", req(branch="580"), "580.159.04") == ("packages", "")
    assert resolve_source("auto", req(version="580.126.20"), None) == ("packages", "")
    assert resolve_source("auto", req(), "580.159.04") == ("preinstalled", "")
    assert resolve_source("auto", req(), None) == ("", NO_DRIVER)
    for key in ("gpunode_driver_branch", "gpunode_driver_version", "gpunode_driver_source"):
        assert key in NO_DRIVER


def test_explicit_sources_and_their_refusals() -> None:
    assert resolve_source("preinstalled", req(version="580.159.04"), "580.159.04") == ("preinstalled", "")
    source, error = resolve_source("preinstalled", req(), None)
    assert (source, error) == ("", "gpunode_driver_source is preinstalled but no NVIDIA driver is loaded on this node")
    source, error = resolve_source("packages", req(), "580.159.04")
    assert source == "" and "gpunode_driver_branch" in error
    assert resolve_source("packages", req(branch="580"), None) == ("packages", "")
    assert (
        "gpunode_driver_source must be one of auto, packages, preinstalled, got 'apt'"
        in resolve_source("apt", req(), None)[1]
    )


def test_preinstalled_driver_is_described_and_checked_against_the_version() -> None:
    assert preinstalled_driver(H200, None) == ("driver 580.159.04 (open) preinstalled", "")
    assert preinstalled_driver(H200, "580.159.04") == ("driver 580.159.04 (open) preinstalled", "")
    description, error = preinstalled_driver(H200, "580.126.20")
    assert description == ""
    assert error == "gpunode_driver_version is 580.126.20 but the preinstalled NVIDIA driver loaded is 580.159.04"
    assert preinstalled_driver(H200, "580.159")[1], "a shorter version is not the same driver"


def test_packages_are_refused_over_a_driver_not_from_packages() -> None:
    error = foreign_driver(H200)
    assert "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04 belongs to no package" in error
    assert "gpunode_driver_replace_preinstalled" in error
    packaged = {**H200, "library": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.04",
                "library_package": "libnvidia-compute-580-server"}  # fmt: skip
    assert foreign_driver(packaged) == ""
    assert foreign_driver({**H200, "loaded": False, "kernel_module_version": None}) == ""


TOOLKIT = {"nvidia-container-toolkit": "1.17.8-1"}


def test_toolkit_auto_source() -> None:
    assert toolkit_source("auto", None, {}, found_outside=False) == "repository"
    assert toolkit_source("auto", None, {}, found_outside=True) == "installed"
    assert toolkit_source("auto", None, TOOLKIT, found_outside=False) == "installed"
    assert toolkit_source("auto", "1.17.8-1", TOOLKIT, found_outside=False) == "installed"
    assert toolkit_source("auto", "1.18.0-1", TOOLKIT, found_outside=False) == "repository"
    assert toolkit_source("deb_dir", None, TOOLKIT, found_outside=True) == "deb_dir"


def test_toolkit_newest_version_offered_for_all_four() -> None:
    names = ["nvidia-container-toolkit", "libnvidia-container1"]
    offered = {"nvidia-container-toolkit": ["1.18.0-1", "1.17.8-1"], "libnvidia-container1": ["1.17.8-1"]}
    assert newest_common_version(offered, names) == "1.17.8-1"
    assert newest_common_version({}, names) is None


@pytest.mark.parametrize(
    ("args", "argument"),
    [(("apt", None, None), "source"), (("repository", "1.17", None), "version"), (("deb_dir", None, "x"), "deb_dir")],
)
def test_toolkit_arguments_name_the_input(args: tuple[str, str | None, str | None], argument: str) -> None:
    with pytest.raises(ToolkitRequestError, match=argument) as raised:
        check_toolkit(*args)
    assert raised.value.argument == argument
    assert check_toolkit("repository", "1.17.8", None) == "1.17.8-1"


def test_version_implies_branch() -> None:
    assert req(version="580.126.20").branch == "580"


def test_ubuntu_prefers_signed_precompiled_modules() -> None:
    plan = plan_driver(UBUNTU, req(version="580.126.20"), {}, LRM)
    assert plan.error == "" and plan.method == "precompiled"
    assert plan.packages["nvidia-headless-no-dkms-580-server"] == "580.126.20-0ubuntu0.24.04.2"
    assert f"linux-signatures-nvidia-{K}" in plan.packages
    assert "nvidia-dkms-580-server" not in plan.packages


def test_ubuntu_open_flavour_names() -> None:
    names = wanted_names(UBUNTU, req(branch="580", flavor="server-open"))
    assert names == [
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server-open",
        f"linux-modules-nvidia-580-server-open-{K}",
        "nvidia-dkms-580-server-open",
        f"linux-headers-{K}",
    ]


def test_ubuntu_secure_boot_without_signed_modules() -> None:
    assert "mok_enrolled" in plan_driver(UBUNTU, req(version="580.126.20", allow_dkms=True), {}, NO_LRM).error
    plan = plan_driver(UBUNTU, req(version="580.126.20", allow_dkms=True, mok_enrolled=True), {}, NO_LRM)
    assert plan.method == "dkms" and plan.packages["nvidia-dkms-580-server"] == "580.126.20-0ubuntu0.24.04.2"
    assert plan.packages[f"linux-headers-{K}"] == ""


def test_secure_boot_unknown_refuses_dkms_unless_the_key_is_declared_enrolled() -> None:
    unknown = HostInfo("debian", "13", "6.12.117+deb13-amd64", "amd64", secure_boot=None)
    available = debian_550(unknown.kernel)
    error = plan_driver(unknown, req(branch="550", allow_dkms=True), {}, available).error
    assert "Secure Boot state is unknown" in error and "mokutil --sb-state" in error and "mok_enrolled" in error
    assert "allow_dkms" in plan_driver(unknown, req(branch="550", mok_enrolled=True), {}, available).error
    plan = plan_driver(unknown, req(branch="550", allow_dkms=True, mok_enrolled=True), {}, available)
    assert plan.error == "" and plan.method == "dkms"
    # Installed and held already: a converged node under unknown Secure Boot is not taken as converged either.
    installed = {name: versions[0] for name, versions in available.items()}
    assert plan_driver(unknown, req(branch="550", allow_dkms=True), installed, None).error == "query"
    converged = plan_driver(unknown, req(branch="550", allow_dkms=True, mok_enrolled=True), installed, None)
    assert converged.method == "dkms"


def test_ubuntu_branch_only_takes_newest_then_keeps_installed() -> None:
    assert plan_driver(UBUNTU, req(branch="580"), {}, LRM).version == "580.126.20"
    installed = {
        "nvidia-headless-no-dkms-580-server": "580.95.05-0ubuntu0.24.04.1",
        "nvidia-utils-580-server": "580.95.05-0ubuntu0.24.04.1",
        f"linux-objects-nvidia-580-server-{K}": "6.8.0-45.45+1",
        f"linux-modules-nvidia-580-server-{K}": "6.8.0-45.45+1",
        f"linux-signatures-nvidia-{K}": "6.8.0-45.45+1",
    }
    plan = plan_driver(UBUNTU, req(branch="580"), installed, None)
    assert plan.error == "" and plan.version == "580.95.05"  # no silent upgrade


def test_ubuntu_retired_and_unsupported() -> None:
    assert "transitional" in plan_driver(UBUNTU, req(branch="550"), {}, {}).error
    old_release = HostInfo("ubuntu", "20.04", K)
    assert "Ubuntu 20.04 is not supported" in plan_driver(old_release, req(branch="580"), {}, {}).error
    assert "rocky" in plan_driver(HostInfo("rocky", "9.4", K), req(branch="580"), {}, {}).error


def test_ubuntu_26_04_carries_580_and_595_and_retires_535() -> None:
    """Ubuntu 26.04's 580-server source builds the 535-server packages as transitional ones; 595's precompiled
    modules exist, proprietary and open, for its 7.0 kernels (package names as packages.ubuntu.com lists them)."""
    kernel = "7.0.0-1015-nvidia"
    resolute = HostInfo("ubuntu", "26.04", kernel, secure_boot=True)
    assert "retired on Ubuntu 26.04: its packages are transitional and pull in branch 580 (choose one of 580, 595)" in (
        plan_driver(resolute, req(branch="535"), {}, {}).error
    )
    assert "driver branch 550 is not in Ubuntu 26.04 (it carries: 580, 595)" in (
        plan_driver(resolute, req(branch="550"), {}, {}).error
    )
    assert "retired" not in plan_driver(UBUNTU, req(branch="535"), {}, {}).error  # 24.04 still carries 535
    assert f"linux-modules-nvidia-595-open-{kernel}" in wanted_names(resolute, req(branch="595", flavor="open"))
    available = {
        "nvidia-headless-no-dkms-595-open": ["595.84.01-0ubuntu1"],
        "nvidia-utils-595-open": ["595.84.01-0ubuntu1"],
        f"linux-modules-nvidia-595-open-{kernel}": ["7.0.0-1015.15+1"],
    }
    plan = plan_driver(resolute, req(version="595.84.01", flavor="open"), {}, available)
    assert plan.error == "" and plan.method == "precompiled", plan.error
    assert plan.packages[f"linux-modules-nvidia-595-open-{kernel}"] == "7.0.0-1015.15+1"


def test_debian_needs_dkms_with_headers_and_pins_each_package() -> None:
    available = {
        "nvidia-driver": ["555.58.02-4", "550.163.01-5.1", "550.163.01-2"],
        "firmware-nvidia-gsp": ["550.163.01-2"],
        "libcuda1": ["550.163.01-2"],
        "nvidia-smi": ["550.163.01-2"],
        "nvidia-kernel-dkms": ["550.163.01-2"],
        f"linux-headers-{DEBIAN.kernel}": ["6.12.117-1"],
    }
    assert "allow_dkms" in plan_driver(DEBIAN, req(branch="550"), {}, available).error
    # nvidia-persistenced is in contrib, which a node with non-free only lacks
    error = plan_driver(DEBIAN, req(branch="550", allow_dkms=True), {}, available).error
    assert "offers no nvidia-persistenced (Debian carries it in the contrib component" in error
    available["nvidia-persistenced"] = ["550.163.01-1"]
    plan = plan_driver(DEBIAN, req(branch="550", allow_dkms=True), {}, available)
    assert plan.packages == {
        "nvidia-driver": "550.163.01-5.1",
        "firmware-nvidia-gsp": "550.163.01-2",
        "libcuda1": "550.163.01-2",  # recommended by nvidia-driver, so asked for by name: CUDA needs it
        "nvidia-smi": "550.163.01-2",
        "nvidia-kernel-dkms": "550.163.01-2",
        f"linux-headers-{DEBIAN.kernel}": "",  # the running kernel's, unpinned: DKMS builds nothing without
        "nvidia-persistenced": "550.163.01-1",  # only recommended too; a version of its own
    }


def test_debian_without_non_free_says_so() -> None:
    error = plan_driver(DEBIAN, req(branch="550", allow_dkms=True), {}, {}).error
    assert "no nvidia-driver on branch 550" in error and "non-free" in error


def test_debian_branches_per_release() -> None:
    bookworm = HostInfo("debian", "12", "6.1.0-30-amd64")
    assert "not in Debian 12" in plan_driver(bookworm, req(branch="550"), {}, {}).error
    assert wanted_names(DEBIAN, req(branch="535")) == [
        "nvidia-tesla-535-driver", "libnvidia-tesla-535-cuda1", "nvidia-tesla-535-smi", "libnvidia-tesla-535-cfg1",
        "nvidia-persistenced", "nvidia-tesla-535-kernel-dkms", f"linux-headers-{DEBIAN.kernel}",
    ]  # fmt: skip
    assert "no open kernel module" in plan_driver(DEBIAN, req(branch="535", flavor="open"), {}, {}).error
    assert wanted_names(DEBIAN, req(branch="550", flavor="open"))[-2] == "nvidia-open-kernel-dkms"


def test_missing_version_in_index() -> None:
    plan = plan_driver(UBUNTU, req(version="580.999.01"), {}, LRM)
    assert "offers no nvidia-headless-no-dkms-580-server at driver version 580.999.01" in plan.error


def test_converged_without_index_query() -> None:
    installed = {name: versions[0] for name, versions in LRM.items() if name != "nvidia-dkms-580-server"}
    plan = plan_driver(UBUNTU, req(version="580.126.20"), installed, None)
    assert plan.error == "" and plan.method == "precompiled"
    assert plan_driver(UBUNTU, req(version="580.126.20"), {}, None).error == "query"


def test_dkms_builds_for_the_kernel_the_node_boots_next_too() -> None:
    """A node mid-upgrade: /vmlinuz names a newer kernel than the running one; DKMS needs both kernels'
    headers, or the node boots into a kernel with no nvidia module."""
    upgrading = HostInfo("debian", "13", "6.12.117+deb13-amd64", "amd64", secure_boot=False,
                         boot_kernel="6.12.120+deb13-amd64")  # fmt: skip
    available = debian_550("6.12.117+deb13-amd64", "6.12.120+deb13-amd64")
    plan = plan_driver(upgrading, req(branch="550", allow_dkms=True), {}, available)
    assert plan.packages["linux-headers-6.12.117+deb13-amd64"] == ""
    assert plan.packages["linux-headers-6.12.120+deb13-amd64"] == ""
    assert plan.kernels == ("6.12.117+deb13-amd64", "6.12.120+deb13-amd64") and plan.unbuilt == ()
    # installed for the running kernel only: not converged, the next kernel's headers are planned
    installed = {name: version or "6.12.117-1" for name, version in plan.packages.items() if "120" not in name}
    assert plan_driver(upgrading, req(version="550.163.01", allow_dkms=True), installed, None).error == "query"
    assert upgrading.kernels == ["6.12.117+deb13-amd64", "6.12.120+deb13-amd64"]
    assert HostInfo("debian", "13", "6.12.117+deb13-amd64", boot_kernel="6.12.117+deb13-amd64").kernels == [
        "6.12.117+deb13-amd64"
    ]


def test_the_running_kernels_headers_gone_from_the_archive_build_for_the_next_boot_only() -> None:
    """Mid-upgrade, the running kernel's headers have left the archive (Debian drops an old kernel ABI at a
    point release): the module is built for the kernel booted next, and the plan says the running one gets
    none. Without the next kernel's headers there is no plan."""
    upgrading = HostInfo("debian", "13", "6.12.48+deb13-amd64", "amd64", secure_boot=False,
                         boot_kernel="6.12.117+deb13-amd64")  # fmt: skip
    available = debian_550("6.12.117+deb13-amd64")
    plan = plan_driver(upgrading, req(branch="550", allow_dkms=True), {}, available)
    assert plan.error == "" and "linux-headers-6.12.48+deb13-amd64" not in plan.packages
    assert plan.kernels == ("6.12.117+deb13-amd64",) and plan.unbuilt == ("6.12.48+deb13-amd64",)
    # installed so: converged without asking the index
    installed = {name: version or "6.12.117-1" for name, version in plan.packages.items()}
    converged = plan_driver(upgrading, req(version="550.163.01", allow_dkms=True), installed, None)
    assert converged.method == "dkms" and converged.unbuilt == ("6.12.48+deb13-amd64",)
    del available["linux-headers-6.12.117+deb13-amd64"]
    error = plan_driver(upgrading, req(branch="550", allow_dkms=True), {}, available).error
    assert error == (
        "the package index offers no linux-headers-6.12.117+deb13-amd64: DKMS cannot build the module for "
        "kernel 6.12.117+deb13-amd64, the one this node boots next"
    )
    # booting the running kernel again: its headers are required
    same = HostInfo("debian", "13", "6.12.117+deb13-amd64", "amd64", secure_boot=False)
    error = plan_driver(same, req(branch="550", allow_dkms=True), {}, available).error
    assert "offers no linux-headers-6.12.117+deb13-amd64" in error


def test_the_driver_a_change_replaces_is_the_installed_lead_packages_version() -> None:
    installed = {
        "nvidia-driver": {"version": "550.163.01-2"}, "libnvidia-ml1": {"version": "550.163.01-2"},
        "nvidia-persistenced": {"version": "550.54.14-1"}, "libnvidia-container1": {"version": "1.17.8-1"},
    }  # fmt: skip
    assert previous_driver(installed, "535.274.02") == "550.163.01"
    assert previous_driver(installed, "550.163.01") == ""  # the same driver: nothing replaced
    tesla = {"nvidia-tesla-535-driver": {"version": "535.274.02-1~deb13u1"}}
    assert previous_driver(tesla, "550.163.01") == "535.274.02"
    ubuntu = {"nvidia-headless-no-dkms-580-server": {"version": "580.95.05-0ubuntu0.24.04.1"}}
    assert previous_driver(ubuntu, "580.126.20") == "580.95.05"
    # two drivers' lead packages side by side: which to remove is not guessed
    both = {**installed, **tesla}
    assert previous_driver(both, "580.126.20") == ""
    assert previous_driver({"nvidia-driver": {"version": "garbage"}}, "550.163.01") == ""


def test_the_replaced_drivers_packages_are_its_versions_exact_pins_and_only_what_apt_takes() -> None:
    installed = {
        "nvidia-driver": {"version": "550.163.01-2"}, "libnvidia-ml1": {"version": "1:550.163.01-2"},
        "nvidia-persistenced": {"version": "550.54.14-1"}, "libnvidia-container1": {"version": "1.17.8-1"},
        "linux-headers-6.12.117+deb13-amd64": {"version": "6.12.117-1"},
        "nvidia-smi;rm": {"version": "550.163.01-2"}, "libcuda1": {"version": "550.163.01-2 x"},
    }  # fmt: skip
    assert previous_set(installed, "550.163.01") == {
        "libnvidia-ml1": "1:550.163.01-2", "nvidia-driver": "550.163.01-2",
        "nvidia-persistenced": "550.54.14-1",  # of a version of its own: kept through the change, put back with it
    }  # fmt: skip
    assert previous_set(installed, "") == {}
