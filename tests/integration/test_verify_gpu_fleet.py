"""The shipped verification suite and the CDI fact on a booted fleet host with planted GPU state.

The package is installed with a plain ``pip install`` into a fresh virtual environment, and the
suite runs as a user runs it (``pytest --pyargs pyinfra_gpunode.verify``) from outside the checkout.
node1 gets two GPUs on its PCI bus and a loaded module: the files are written inside the container
and bind-mounted there over ``/sys/bus/pci/devices`` and ``/sys/module`` (the container's own mount
namespace; removed afterwards). CDI specs are planted in nvidia-ctk's real layouts (YAML with sorted
keys, JSON), broken, and as the device plugin writes them, and read with the fact's own command.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.facts.cdi import CdiSpecs
from tests.fleet.fleet import Fleet
from tests.fleet.plugin import Verify
from tests.packaging import build_lock

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/facts/cdi.CdiSpecs"
PLANTED = "/root/gpunode-planted"
DRIVER = "580.159.04"  # the version of the fixture specs
pytestmark = pytest.mark.fleet


def fixture_specs(name: str) -> dict[str, str]:
    """The spec files of a CdiSpecs fixture, by path, as the fact's command printed them."""
    files: dict[str, list[str]] = {}
    current: list[str] = []
    for line in json.loads((FIXTURES / f"{name}.json").read_text())["output"]:
        if line.startswith("@@gpunode-cdi-spec "):
            current = files.setdefault(line.split(" ", 2)[2], [])
        else:
            current.append(line)
    return {path: "\n".join(lines[:-1]) + "\n" for path, lines in files.items()}  # the fact's own trailing echo


def expected_facts(name: str) -> list[dict[str, object]]:
    return [{**spec, "mtime": None} for spec in json.loads((FIXTURES / f"{name}.json").read_text())["fact"]]


def on(fleet: Fleet, host: str, command: str) -> str:
    result = fleet.run(host, command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def plant_files(fleet: Fleet, host: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        directory, target = shlex.quote(path.rsplit("/", 1)[0]), shlex.quote(path)
        on(fleet, host, f"mkdir -p {directory} && cat > {target} << 'GPUNODE_EOF'\n{text}GPUNODE_EOF")


def read_specs(fleet: Fleet, host: str) -> list[dict[str, object]]:
    """CdiSpecs through its own command on the host, with the modification times left out."""
    lines = on(fleet, host, CdiSpecs().command()).splitlines()
    specs = CdiSpecs().process(lines)
    assert all(isinstance(spec["mtime"], int) for spec in specs)
    return [{**spec, "mtime": None} for spec in specs]


def clear_specs(fleet: Fleet, host: str) -> None:
    on(fleet, host, "rm -f /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json")


@pytest.mark.parametrize("name", ["ctk_sorted_yaml_h200", "ctk_json", "device_plugin_json", "broken_and_good"])
def test_cdi_specs_read_on_a_host_as_the_fixtures_say(fleet: Fleet, name: str) -> None:
    clear_specs(fleet, "node1")
    try:
        plant_files(fleet, "node1", fixture_specs(name))
        assert read_specs(fleet, "node1") == expected_facts(name)
    finally:
        clear_specs(fleet, "node1")


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtual environment with ``pip install <checkout>`` (no extras, no editable install)."""
    directory = tmp_path_factory.mktemp("plain-install")
    venv.EnvBuilder(with_pip=True).create(directory / "venv")
    python = directory / "venv/bin/python"
    with build_lock():  # pip builds the wheel in the checkout
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(REPO)], check=True, capture_output=True, timeout=900
        )
    assert str(REPO) not in subprocess.run(
        [str(python), "-c", "import pyinfra_gpunode.verify as v; print(v.__file__)"],
        check=True, capture_output=True, text=True, cwd=directory,
    ).stdout  # fmt: skip
    return str(python)


@pytest.fixture
def gpu_node1(fleet: Fleet) -> Iterator[None]:
    """node1 with two GPUs on its PCI bus and driver module DRIVER loaded; cleaned up afterwards."""
    sys_files = [
        *(f"pci/0000:{bus}:00.0/{name} {value}" for bus in ("41", "42")
          for name, value in (("vendor", "0x10de"), ("class", "0x030200"), ("device", "0x2335"))),
        f"module/nvidia/version {DRIVER}",
    ]  # fmt: skip
    script = [f"mkdir -p {PLANTED}"]
    for entry in sys_files:
        path, value = entry.split(" ")
        script.append(f"mkdir -p {PLANTED}/{path.rsplit('/', 1)[0]} && echo {value} > {PLANTED}/{path}")
    script += [f"mount --bind {PLANTED}/pci /sys/bus/pci/devices", f"mount --bind {PLANTED}/module /sys/module"]
    clear_specs(fleet, "node1")
    try:
        on(fleet, "node1", " && ".join(script))
        yield
    finally:
        fleet.run("node1", f"umount /sys/bus/pci/devices; umount /sys/module; rm -rf {PLANTED}")
        fleet.run("node1", "rm -f /usr/bin/nvidia-container-runtime")
        clear_specs(fleet, "node1")


def outcomes(output: str, host: str) -> dict[str, str]:
    """``{check name: PASSED|FAILED|SKIPPED}`` of the suite's verbose output for ``host``."""
    found = {}
    for line in output.splitlines():
        if f"[{host}] " in line and "::" in line and line.split(" ", 1)[0] not in ("FAILED", "ERROR"):
            name = line.split("::", 1)[1].split("[", 1)[0]
            found[name] = line.rsplit("] ", 1)[1].split()[0]
    return found


def test_shipped_suite_judges_gpu_state_from_a_plain_install(
    fleet: Fleet, verify: Verify, plain_install: str, gpu_node1: None
) -> None:
    ctk = fixture_specs("ctk_sorted_yaml_h200")["/etc/cdi/nvidia.yaml"]  # lists 0, a UUID and all
    plugin = fixture_specs("device_plugin_json")["/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"]
    plant_files(fleet, "node1", {
        "/etc/cdi/nvidia.yaml": ctk,
        "/etc/cdi/broken.json": '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu"\n',
        "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json": plugin.replace(DRIVER, "570.195.03"),
    })  # fmt: skip
    first = verify(fleet, checks="gpu", hosts=["node1", "node2"], python=plain_install)
    assert "ModuleNotFoundError" not in first.stdout + first.stderr
    node1, node2 = outcomes(first.stdout, "node1"), outcomes(first.stdout, "node2")
    assert set(node2.values()) == {"SKIPPED"} and len(node2) == 7, first.stdout  # no GPU on node2's bus
    assert node1 == {
        "test_driver_loaded_and_matches_userspace": "FAILED",  # no libnvidia-ml.so.1 on the node
        "test_nvml_driver_matches_module": "SKIPPED",  # no pynvml on the node
        "test_nvml_sees_every_pci_gpu": "SKIPPED",
        "test_fabric_manager_active_on_nvswitch_nodes": "SKIPPED",
        "test_toolkit_runtime_binary_present": "FAILED",
        "test_cdi_spec_current_and_lists_every_gpu": "FAILED",
        "test_no_broken_or_stale_cdi_spec": "FAILED",
    }, first.stdout
    assert "no libnvidia-ml.so.1 found by the loader (module 580.159.04 loaded)" in first.stdout
    assert "/etc/cdi/nvidia.yaml lists no device 1 for 2 GPU(s)" in first.stdout
    assert "/etc/cdi/broken.json is not valid YAML or JSON" in first.stdout
    assert "/usr/bin/nvidia-container-runtime is missing or not executable" in first.stdout

    two_gpus = ctk.replace('  name: "0"\n', '  name: "0"\n- containerEdits: {}\n  name: "1"\n', 1)
    plant_files(fleet, "node1", {
        "/etc/cdi/nvidia.yaml": two_gpus,
        "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json": plugin,
        "/usr/bin/nvidia-container-runtime": "#!/bin/sh\n",
    })  # fmt: skip
    on(fleet, "node1", "rm /etc/cdi/broken.json && chmod 755 /usr/bin/nvidia-container-runtime")
    second = verify(fleet, checks="gpu", hosts=["node1"], python=plain_install)
    node1 = outcomes(second.stdout, "node1")
    assert node1["test_cdi_spec_current_and_lists_every_gpu"] == "PASSED", second.stdout
    assert node1["test_no_broken_or_stale_cdi_spec"] == "PASSED", second.stdout
    assert node1["test_toolkit_runtime_binary_present"] == "PASSED", second.stdout
    assert node1["test_driver_loaded_and_matches_userspace"] == "FAILED", second.stdout
