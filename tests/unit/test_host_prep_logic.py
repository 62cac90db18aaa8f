"""Kernel holds, unattended-upgrades and needrestart drop-ins, fact-output helpers."""

import inspect
import re

import pytest

from pyinfra_gpunode.kernel_plan import kernel_packages
from pyinfra_gpunode.needrestart import check_services, parse_needrestart_conf, render_needrestart_conf
from pyinfra_gpunode.sections import parse_dpkg_status, split_sections
from pyinfra_gpunode.unattended import parse_apt_config_dump, render_apt_conf, unattended_enabled

UBUNTU = [
    "linux-generic", "linux-image-generic", "linux-headers-generic", "linux-image-5.15.0-91-generic",
    "linux-modules-5.15.0-91-generic", "linux-modules-extra-5.15.0-91-generic", "linux-headers-5.15.0-91-generic",
    "linux-headers-5.15.0-91", "linux-image-5.15.0-88-generic", "linux-modules-5.15.0-88-generic",
    "linux-modules-nvidia-580-server-5.15.0-91-generic", "linux-modules-nvidia-580-server-generic",
    "linux-objects-nvidia-580-server-5.15.0-91-generic", "linux-signatures-nvidia-5.15.0-91-generic",
    "linux-libc-dev", "linux-firmware", "linux-tools-common", "linux-base",
]  # fmt: skip


def test_ubuntu_kernel_hold_set() -> None:
    assert kernel_packages("5.15.0-91-generic", UBUNTU) == sorted(
        [
            "linux-generic", "linux-image-generic", "linux-headers-generic", "linux-image-5.15.0-91-generic",
            "linux-modules-5.15.0-91-generic", "linux-modules-extra-5.15.0-91-generic",
            "linux-headers-5.15.0-91-generic", "linux-headers-5.15.0-91",
            "linux-modules-nvidia-580-server-5.15.0-91-generic", "linux-modules-nvidia-580-server-generic",
            "linux-objects-nvidia-580-server-5.15.0-91-generic", "linux-signatures-nvidia-5.15.0-91-generic",
        ]
    )  # fmt: skip


def test_debian_kernel_hold_set() -> None:
    installed = [
        "linux-image-amd64", "linux-headers-amd64", "linux-image-6.12.117+deb13-amd64",
        "linux-headers-6.12.117+deb13-amd64", "linux-headers-6.12.117+deb13-common", "linux-kbuild-6.12.117+deb13",
        "linux-image-6.12.95+deb13-amd64", "linux-base", "linux-sysctl-defaults",
    ]  # fmt: skip
    assert kernel_packages("6.12.117+deb13-amd64", installed) == [
        "linux-headers-6.12.117+deb13-amd64",
        "linux-headers-6.12.117+deb13-common",
        "linux-headers-amd64",
        "linux-image-6.12.117+deb13-amd64",
        "linux-image-amd64",
    ]


def test_apt_conf_disabled_and_blacklist() -> None:
    disabled = render_apt_conf("disabled")
    periodic, _ = parse_apt_config_dump(line for line in disabled.splitlines() if '"' in line)
    assert periodic == {"Enable": "0", "Update-Package-Lists": "0", "Unattended-Upgrade": "0"}
    assert not unattended_enabled(periodic)
    text = render_apt_conf("blacklist", ["linux-", "libstdc++6"])
    assert '    "libstdc\\+\\+6";' in text
    assert render_apt_conf("blacklist") == render_apt_conf("blacklist")
    with pytest.raises(ValueError, match="'linux-; rm'"):
        render_apt_conf("blacklist", ["linux-; rm"])
    with pytest.raises(ValueError, match="'never'"):
        render_apt_conf("never")


def test_apt_config_dump_sample() -> None:
    dump = [
        'APT::Periodic "";',
        'APT::Periodic::Update-Package-Lists "1";',
        'APT::Periodic::Unattended-Upgrade "1";',
        'APT::Periodic::Unattended-Upgrade "0";',
        'Unattended-Upgrade::Package-Blacklist "";',
        'Unattended-Upgrade::Package-Blacklist:: "linux-";',
        'Unattended-Upgrade::Package-Blacklist:: "nvidia-";',
    ]
    periodic, blacklist = parse_apt_config_dump(dump)
    assert periodic == {"Update-Package-Lists": "1", "Unattended-Upgrade": "0"}
    assert blacklist == ["linux-", "nvidia-"]
    assert not unattended_enabled({})  # missing means 0
    assert unattended_enabled({"Unattended-Upgrade": "1"})
    assert not unattended_enabled({"Enable": "0", "Unattended-Upgrade": "1"})


def test_needrestart_dropin_round_trip() -> None:
    text = render_needrestart_conf(["containerd", "kubelet", "cri-o"])
    assert parse_needrestart_conf(text.splitlines(), ["containerd", "kubelet", "cri-o", "cron"]) == {
        "mode": "l",
        "excluded": ["containerd", "kubelet", "cri-o"],
    }
    shipped = ["#$nrconf{restart} = 'i';", "$nrconf{override_rc} = {", "    qr(^docker) => 0,", "};"]
    assert parse_needrestart_conf(shipped) == {"mode": None, "excluded": []}
    with pytest.raises(ValueError, match=r"'containerd\.service'"):
        check_services(["containerd.service"])


def test_sections_and_dpkg_status() -> None:
    sections = split_sections(["junk", "@@a", "1", "@@b", "@@a", "2", "@@spec /x 1"])
    assert sections == {"a": ["1", "2", "@@spec /x 1"], "b": []}
    status = parse_dpkg_status(
        ["hi \tbash\t5.2.15-2+b8", "ii \tcoreutils\t9.1-1", "un \tlinux-perf\t", "rc \told\t1.0", "iW \tx:amd64\t2"]
    )
    assert status == {
        "bash": {"version": "5.2.15-2+b8", "held": True},
        "coreutils": {"version": "9.1-1", "held": False},
        "x": {"version": "2", "held": False},
    }


def test_distribution_refusal_names_the_distribution() -> None:
    from pyinfra_gpunode.operations.distribution import refusal

    rocky = {"NAME": "Rocky Linux", "ID": "rocky", "ID_LIKE": "rhel centos fedora", "VERSION_ID": "9.4"}
    assert refusal(rocky) == (
        "distribution rocky 9.4 is not supported (supported: debian, ubuntu); nothing was changed on this node"
    )
    assert refusal({"ID": "debian"}) is None  # sid has no VERSION_ID
    assert refusal({"ID": "ubuntu", "VERSION_ID": "24.04"}) is None
    assert refusal({"ID": "linuxmint", "ID_LIKE": "ubuntu debian", "VERSION_ID": "22"}) is not None
    assert "unknown (no /etc/os-release)" in (refusal({}) or "")


def test_trailing_newline_is_not_a_name() -> None:
    with pytest.raises(ValueError, match=r"'nvidia-\\n'"):
        render_apt_conf("blacklist", ["linux-", "nvidia-\n"])
    with pytest.raises(ValueError, match=r"'containerd\\n'"):
        check_services(["containerd\n"])


def _operations() -> list[object]:
    from pyinfra_gpunode.operations import (
        cdi,
        distribution,
        driver,
        fabric_manager,
        kernel,
        toolkit,
        unattended_upgrades,
    )

    return [
        kernel.held, kernel.nouveau_blacklisted, unattended_upgrades.configured, driver.driver,
        fabric_manager.fabric_manager, toolkit.container_toolkit, cdi.spec, distribution.supported,
    ]  # fmt: skip


@pytest.mark.parametrize("op", _operations(), ids=lambda op: op.__name__)
def test_operation_docstrings_follow_pyinfra(op: object) -> None:
    inner = op._inner  # type: ignore[attr-defined]
    doc = inner.__doc__ or ""
    documented = re.findall(r"^    \+ (\w+):", doc, re.M)
    assert documented == list(inspect.signature(inner).parameters)
    assert "**Example:**" in doc and ".. code:: python" in doc
    assert re.search(rf"\b{op.__module__.rsplit('.', 1)[-1]}\.{inner.__name__}\(name=", doc)  # type: ignore[attr-defined]


def _facts() -> list[type]:
    from pyinfra_gpunode.facts import (
        cdi,
        driver,
        fabric_manager,
        gpus,
        kernel,
        nvml,
        package_index,
        toolkit,
        unattended_upgrades,
    )

    return [
        driver.NvidiaDriver, gpus.NvidiaGpus, nvml.NvmlInfo, fabric_manager.NvidiaFabricManager,
        toolkit.NvidiaContainerToolkit, driver.NvidiaHostState, package_index.NvidiaAptVersions, cdi.CdiSpecs,
        kernel.KernelState, kernel.KernelSecureBoot, kernel.NouveauBlacklist,
        unattended_upgrades.UnattendedUpgradesState,
    ]  # fmt: skip


@pytest.mark.parametrize("fact", _facts(), ids=lambda fact: fact.__name__)
def test_fact_docstrings_follow_pyinfra(fact: type) -> None:
    doc = fact.__doc__ or ""
    assert doc.strip().startswith("Returns ")
    assert ".. code:: python" in doc
