"""Who owns each layer beside the GPU Operator (pure logic), and the readiness links it adds, from
the operator's real-ish files (``tests/corpus/containerd/gpu-operator-toolkit*.toml``) and the
H200's facts as read."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.hostdata import HostDataError, validate
from pyinfra_gpunode.operator import (
    GPUNODE,
    OPERATOR,
    OPERATOR_DROPIN,
    USER,
    defined_runtime,
    handler_problem,
    operator_runtime,
    runtime_writers,
    writer_of,
)
from pyinfra_gpunode.readiness import BROKEN, OK, UNKNOWN, assess
from tests.unit.test_readiness import BINARY, SPEC, _containerd, healthy

TESTS = Path(__file__).resolve().parents[1]
CORPUS = TESTS / "corpus/containerd"
MAIN = "/etc/containerd/config.toml"
OUR_DROPIN = "/etc/containerd/gpunode/nvidia-runtime.toml"
TOOLKIT_RUNTIME = "/usr/local/nvidia/toolkit/nvidia-container-runtime"


def corpus(name: str) -> str:
    return (CORPUS / name).read_text()


def operator_state(name: str) -> dict[str, Any]:
    path = TESTS / "facts/operator.GpuOperatorState" / f"{name}.json"
    return copy.deepcopy(json.loads(path.read_text())["fact"])


@pytest.mark.parametrize("name", ["gpu-operator-toolkit+99-nvidia.toml", "gpu-operator-toolkit-v3+99-nvidia.toml"])
def test_the_operators_drop_in_defines_nvidia_under_its_toolkit(name: str) -> None:
    assert defined_runtime(corpus(name), "nvidia") == (True, TOOLKIT_RUNTIME)
    assert defined_runtime(corpus(name), "nvidia-cdi") == (True, TOOLKIT_RUNTIME + ".cdi")
    assert defined_runtime(corpus(name), "other") == (False, None)


def test_a_file_that_does_not_parse_defines_no_runtime() -> None:
    assert defined_runtime('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia\n', "nvidia") == (
        False,
        None,
    )
    assert defined_runtime("plugins = 3\n", "nvidia") == (False, None)


def test_writer_of_each_file() -> None:
    assert writer_of(OUR_DROPIN, "/usr/bin/nvidia-container-runtime", True) == GPUNODE
    assert writer_of("/etc/containerd/config.toml", TOOLKIT_RUNTIME, False) == OPERATOR
    # nvidia-ctk on the host writes the same path: the operator's only where its binaries are installed.
    assert writer_of(OPERATOR_DROPIN, "/usr/bin/nvidia-container-runtime", False) == USER
    assert writer_of(OPERATOR_DROPIN, "/usr/bin/nvidia-container-runtime", True) == OPERATOR
    assert writer_of(MAIN, "/usr/local/nvidia/toolkit/../../bin/runc", False) == USER
    k3s = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    assert writer_of(k3s, "/usr/bin/nvidia-container-runtime", False, "k3s") == "k3s"
    assert writer_of(k3s.replace("k3s", "rke2"), "/usr/bin/nvidia-container-runtime", False, "rke2") == "RKE2"
    assert writer_of(k3s, "/usr/bin/nvidia-container-runtime", False, "rke2") == USER  # not RKE2's file
    assert writer_of(k3s, TOOLKIT_RUNTIME, True, "k3s") == OPERATOR  # k3s found the operator's binaries
    assert writer_of("/etc/k0s/containerd.d/nvidia-gpunode.toml", "/usr/bin/nvidia-container-runtime", False) == GPUNODE


def test_operator_runtime_is_found_by_its_binary_or_its_drop_in_and_binaries() -> None:
    texts = {MAIN: corpus("gpu-operator-toolkit.toml"), OPERATOR_DROPIN: corpus("gpu-operator-toolkit+99-nvidia.toml")}
    none = operator_state("no_operator")
    found = operator_runtime(runtime_writers(texts, "nvidia", none), none)
    assert found is not None and found.path == OPERATOR_DROPIN and found.binary == TOOLKIT_RUNTIME
    host_toolkit = {MAIN: corpus("nvidia-ctk-dropin.toml"), OPERATOR_DROPIN: corpus("nvidia-ctk-dropin+99-nvidia.toml")}
    assert operator_runtime(runtime_writers(host_toolkit, "nvidia", none), none) is None
    installed = operator_state("driver_container_and_toolkit")
    assert operator_runtime(runtime_writers(host_toolkit, "nvidia", installed), installed) is not None


def test_handler_problem_names_a_missing_runtime_and_a_wrong_binary() -> None:
    runtimes = {"nvidia": {"BinaryName": BINARY}, "runc": {"BinaryName": None}}
    assert handler_problem(runtimes, "nvidia", BINARY) is None
    missing = handler_problem(runtimes, "nvidia-cdi", BINARY)
    assert missing and "handler nvidia-cdi (gpunode_runtime_handler) names no runtime" in missing
    wrong = handler_problem(runtimes, "runc", BINARY)
    assert wrong and "runs runc (no BinaryName), not the toolkit's /usr/bin/nvidia-container-runtime" in wrong


@pytest.mark.parametrize("value", ["nv idia", "", "-x", "a/b", 3])
def test_bad_runtime_handler_is_refused_naming_the_key(value: Any) -> None:
    with pytest.raises(HostDataError, match="gpunode_runtime_handler"):
        validate({"gpunode_runtime_handler": value})
    assert validate({})["gpunode_runtime_handler"] == "nvidia"
    assert validate({})["gpunode_take_over_runtime"] is False


def links(facts: dict[str, Any], handler: str = "nvidia") -> dict[str, Any]:
    return {link.id: link for link in assess("gpu1", facts, BINARY, SPEC, handler).links}


def test_second_writer_beside_the_operator_is_broken_with_the_sighups_tied_to_it() -> None:
    facts = healthy()
    files = {
        MAIN: corpus("gpu-operator-toolkit.toml").replace('imports = ["/etc/containerd/conf.d/*.toml"]', ""),
        OUR_DROPIN: corpus("nvidia-ctk-dropin+99-nvidia.toml"),
    }
    files[MAIN] = 'imports = ["/etc/containerd/conf.d/*.toml", "' + OUR_DROPIN + '"]\n' + files[MAIN]
    facts["containerd"] = _containerd(files, ["nvidia", "runc"])
    facts["operator"] = operator_state("driver_container_and_toolkit")
    facts["containerd_journal"] = {
        "signals": [{"time": "2026-12-01T00:45:12.4+00:00", "signal": "SIGHUP"}],
        "restarts": ["2026-12-01T00:45:12.9+00:00"],
    }
    found = links(facts)
    writers = found["runtime_writers"]
    assert writers.state == BROKEN
    assert f"{OPERATOR_DROPIN} (GPU Operator toolkit, BinaryName {TOOLKIT_RUNTIME})" in writers.cause
    assert f"{OUR_DROPIN} (gpunode, BinaryName /usr/bin/nvidia-container-runtime)" in writers.cause
    assert "containerd was sent SIGHUP 1 time(s) (last 2026-12-01T00:45:12.4+00:00): the GPU Operator's toolkit" in (
        writers.cause
    )
    assert "`toolkit.enabled=false`" in writers.fix
    assert "the GPU Operator's toolkit (/usr/local/nvidia/toolkit) restarts containerd with SIGHUP" in (
        found["containerd_restarts"].cause
    )
    owners = found["owners"].detail
    assert "toolkit: host packages (libnvidia-container" in owners
    assert "and GPU Operator toolkit (/usr/local/nvidia/toolkit)" in owners
    assert "validations: .driver-ctr-ready, driver-ready, toolkit-ready" in owners


def test_one_writer_is_ok_and_a_handler_without_runtime_is_broken() -> None:
    facts = healthy()
    found = links(facts)
    assert found["runtime_writers"].state == OK and found["runtime_handler"].state == OK
    missing = links(facts, handler="nvidia-cdi")["runtime_handler"]
    assert missing.state == BROKEN and "no runtime named nvidia-cdi" in missing.cause
    plain = links(facts, handler="runc")["runtime_handler"]
    assert plain.state == BROKEN and "runtime runc runs plain runc (no BinaryName)" in plain.cause


def test_driver_container_userspace_is_read_from_its_root() -> None:
    facts = healthy()
    facts["host"]["driver"].update(
        kernel_module_version="580.95.05",
        userspace_version=None,
        library=None,
        library_package=None,
        nvidia_smi_ok=False,
    )
    facts["nvml"] = None
    facts["host"]["pci"]["nvswitch"] = True
    facts["operator"] = operator_state("driver_container_and_toolkit")
    found = links(facts)
    assert found["nvml"].state == OK, found["nvml"]
    assert found["nvml"].detail.startswith("module and library 580.95.05 (GPU Operator driver container, ")
    assert found["fabric_manager"].state == UNKNOWN
    assert "driver: GPU Operator driver container (/run/nvidia/driver)" in found["owners"].detail
    facts["operator"] = operator_state("no_operator")
    assert links(facts)["nvml"].state == BROKEN  # the same node without the driver root: no library
