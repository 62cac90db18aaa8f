"""The GPU Operator beside the deploys on three systemd hosts (trixie, Debian's containerd 1.7.24).

- op1: host driver; the operator's toolkit container has installed its binaries in
  ``/usr/local/nvidia/toolkit``, written ``/etc/containerd/conf.d/99-nvidia.toml`` with config.toml
  importing ``conf.d`` (``tests/corpus/containerd/gpu-operator-toolkit*.toml``, sources on their first
  lines) and "reloaded" containerd the way its ``SignalContainerd`` does (NVIDIA/nvidia-container-toolkit,
  cmd/nvidia-ctk-installer/container/runtime/containerd/containerd_linux.go: containerd's PID read from
  its socket, then ``kill(pid, SIGHUP)``, no systemd involved). The deploys refuse it untouched;
  ``gpunode_take_over_runtime`` loads our runtime last and the report names both writers and the SIGHUP.
- op2: the operator's driver container (its root ``/run/nvidia/driver`` with Debian's real
  libnvidia-ml, the module loaded, nothing of the driver on the host) and a host toolkit 1.18 with its
  refresh units; the device plugin's spec is left from the driver before (NVIDIA/k8s-device-plugin,
  internal/cdi/cdi.go).
- op3: host driver and toolkit 1.18 with its CDI refresh units as its package installs and enables
  them (NVIDIA/nvidia-container-toolkit v1.18.0, deployments/systemd/, packaging/debian/
  nvidia-container-toolkit-base.{install,postinst}); its spec is left from the driver before.

Real: systemd, sshd, apt and dpkg, containerd 1.7.24 (its restarts, ``config dump``, the running
daemon's CRI start line), the SIGHUP and what systemd journals of it (``Restart=always`` as Debian's
unit has), the refresh units run by systemd, Debian's libnvidia-ml, the validator's marker files.
Planted: the GPU on the PCI bus and the loaded module (bind mounts over ``/sys/bus/pci/devices``,
``/sys/module``, ``/proc/driver``, as the other GPU fleet tests do), the device nodes (mknod), and
stand-ins for NVIDIA's binaries (in no Debian archive): ``nvidia-ctk`` answers ``--version`` and
writes a spec in its layout for the libnvidia-ml it finds, the others print their version.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory
from tests.integration.gpu_state import DRIVER, LIBRARY, LIBRARY_DIR, cdi_spec, libnvidia_ml
from tests.integration.summary import summary_rows
from tests.integration.test_gpu_node_fleet import sh

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests/corpus/containerd"
SAMPLES = REPO / "tests/samples"
NODES = ("op1", "op2", "op3")
pytestmark = pytest.mark.fleet

OLD_DRIVER = "550.144.03"  # the driver before the planted driver change
PLANTED = "/root/gpunode-planted-gpu"
OPERATOR_DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
OUR_DROPIN = "/etc/containerd/gpunode/nvidia-runtime.toml"
TOOLKIT = "/usr/local/nvidia/toolkit"
DRIVER_ROOT = "/run/nvidia/driver"
ROOT_LIBRARY = f"{DRIVER_ROOT}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{DRIVER}"
PLUGIN_SPEC = "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
REFRESH_SPEC = "/var/run/cdi/nvidia.yaml"
STAND_IN_LOG = "/var/log/nvidia-ctk-stand-in.log"
CRI_STARTED = (
    "for i in $(seq 150); do id=$(systemctl show -p InvocationID --value containerd); "
    'if [ "$(systemctl is-active containerd)" = active ] && journalctl --no-pager -o cat '
    '_SYSTEMD_INVOCATION_ID="$id" | grep -q "Start cri plugin"; then exit 0; fi; sleep 0.1; done; exit 1'
)
# The operator's toolkit finds containerd by its socket and signals it (SignalContainerd; the PID is the
# socket peer's credentials, which SO_PEERCRED reads too).
SIGHUP_AS_THE_TOOLKIT = (
    "python3 -c 'import os, signal, socket, struct; s = socket.socket(socket.AF_UNIX); "
    's.connect("/run/containerd/containerd.sock"); '
    'pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]; '
    "os.kill(pid, signal.SIGHUP); print(pid)'"
)
# nvidia-ctk-installer v1.20.0 (cmd/nvidia-ctk-installer/toolkit/installer/executables.go) installs each of
# these as a shell wrapper that sets PATH and the toolkit's config file and runs a ``.real`` copy beside it.
WRAPPER = '#!/bin/sh\nPATH={toolkit}:$PATH exec {toolkit}/{name}.real "$@"\n'
OPERATOR_EXECUTABLES = (
    "nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy",
    "nvidia-container-cli", "nvidia-container-runtime-hook",
)  # fmt: skip
# cmd/nvidia-validator/driver.go and main.go (createStatusFile) of NVIDIA/gpu-operator.
HOST_DRIVER_READY = (
    "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n"
    "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
)
CONTAINER_DRIVER_READY = (
    f"IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT={DRIVER_ROOT}\nDRIVER_ROOT_CTR_PATH=/driver-root\n"
    "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
)
# Stand-in for nvidia-ctk (NVIDIA's toolkit is in no Debian archive): ``--version`` as the real one
# answers; ``cdi generate`` writes a spec in its layout for the libnvidia-ml in the driver root
# (``--driver-root``, default /) to ``--output`` or $NVIDIA_CTK_CDI_OUTPUT_FILE_PATH (the refresh unit's).
NVIDIA_CTK = f"""#!/bin/sh
echo "$* unit=${{INVOCATION_ID:+systemd}} out=${{NVIDIA_CTK_CDI_OUTPUT_FILE_PATH:-}}" >> {STAND_IN_LOG}
case "$1" in --version) echo "NVIDIA Container Toolkit CLI version 1.18.0"; exit 0;; esac
[ "$1 $2" = "cdi generate" ] || exit 1
root= out=$NVIDIA_CTK_CDI_OUTPUT_FILE_PATH
for arg; do case $arg in --driver-root=*) root=${{arg#*=}};; --output=*) out=${{arg#*=}};; esac; done
lib=$(ls "$root"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.[0-9]*.* "$root"{LIBRARY_DIR}/libnvidia-ml.so.[0-9]*.* \\
    2>/dev/null | head -n 1)
[ -n "$lib" ] && [ -n "$out" ] || exit 1
ctr=${{lib#$root}}
mkdir -p "${{out%/*}}"
sed -e "s|@HOST@|$lib|" -e "s|@CTR@|$ctr|" /usr/share/nvidia-ctk-stand-in/spec.yaml > "$out"
"""
SPEC_TEMPLATE = cdi_spec().replace(
    f"  - containerPath: {LIBRARY}\n    hostPath: {LIBRARY}\n", "  - containerPath: @CTR@\n    hostPath: @HOST@\n"
)


def device_plugin_spec(driver: str) -> str:
    """The device plugin's own spec on a driver-container node (k8s-device-plugin internal/cdi/cdi.go: vendor
    k8s.device-plugin.nvidia.com, class gpu, ``<vendor>-<class>.json``, library paths moved from the
    container's /driver-root to the host's driver root; the edits are nvcdi's)."""
    library = f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{driver}"
    return json.dumps({
        "cdiVersion": "0.5.0",
        "kind": "k8s.device-plugin.nvidia.com/gpu",
        "devices": [{
            "name": "GPU-5e2e1f2c-8a52-2d4a-52b5-4b2e6e0d8c4f",
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}]},
        }],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"}],
            "hooks": [{
                "hookName": "createContainer", "path": f"{TOOLKIT}/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={driver}"],
            }],
            "mounts": [{
                "hostPath": DRIVER_ROOT + library, "containerPath": library,
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
            }],
        },
    })  # fmt: skip


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    # Names of their own: fleets share network namespaces by host name.
    with fleet_factory.lent([HostSpec(name, "trixie") for name in NODES], "operator") as booted:
        yield booted


def plant(fleet: Fleet, node: str, files: dict[str, str | bytes], script: str, links: dict[str, str]) -> str:
    """Write ``files`` (a ``#!`` file executable) and symbolic ``links`` into the node's own filesystem (a
    tar stream unpacked there, so ``/run`` is the node's), then run ``script`` there; one SSH call (each
    costs a second). Returns the script's output."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(path.replace("/var/run/", "/run/", 1).lstrip("/"))
            info.size, info.mode = len(data), 0o755 if data.startswith(b"#!") else 0o644
            archive.addfile(info, io.BytesIO(data))
        for path, target in links.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), node, f"tar -x -f - -C / --no-same-owner && {script}"],
        input=buffer.getvalue(), capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{node}: {done.stderr.decode()}"
    return done.stdout.decode()


def reads(fleet: Fleet, node: str, *commands: str) -> list[str]:
    """The output of each of ``commands``, run on ``node`` in one SSH call."""
    mark = "@@gpunode-test-read@@"
    return sh(fleet, node, f"; echo {mark}; ".join(f"{{ {command}; }}" for command in commands)).split(f"{mark}\n")


def gpu_on_the_bus(module: str = DRIVER) -> dict[str, str | bytes]:
    """An H100 on the PCI bus and nvidia ``module`` loaded, as files that ``MOUNT_GPU`` mounts over the host's."""
    proc = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {module}  Tue Apr  1 00:00:00 UTC 2025\n"
    return {
        f"{PLANTED}/pci/0000:41:00.0/vendor": "0x10de\n", f"{PLANTED}/pci/0000:41:00.0/class": "0x030200\n",
        f"{PLANTED}/pci/0000:41:00.0/device": "0x2331\n", f"{PLANTED}/module/nvidia/version": module + "\n",
        f"{PLANTED}/proc/nvidia/version": proc,
    }  # fmt: skip


MOUNT_GPU = (
    f"mount --bind {PLANTED}/pci /sys/bus/pci/devices && mount --bind {PLANTED}/module /sys/module && "
    f"mount --bind {PLANTED}/proc /proc/driver && "
    "mknod -m 666 /dev/nvidiactl c 195 255 && mknod -m 666 /dev/nvidia0 c 195 0"
)


def host_library() -> dict[str, str | bytes]:
    """Debian's real libnvidia-ml outside any package, for the loader (a runfile or image driver; ``ldconfig``)."""
    return {LIBRARY: libnvidia_ml().read_bytes(), "/etc/ld.so.conf.d/nvidia.conf": LIBRARY_DIR + "\n"}


def host_toolkit() -> dict[str, str | bytes]:
    """The toolkit's binaries where its packages put them (outside dpkg), nvidia-ctk the spec-writing stand-in."""
    runtime = "#!/bin/sh\necho 'NVIDIA Container Runtime version 1.18.0'\n"
    return {
        "/usr/bin/nvidia-ctk": NVIDIA_CTK, "/usr/share/nvidia-ctk-stand-in/spec.yaml": SPEC_TEMPLATE,
        "/usr/bin/nvidia-container-runtime": runtime, "/usr/bin/nvidia-cdi-hook": runtime,
    }  # fmt: skip


def operator_toolkit() -> dict[str, str | bytes]:
    """The operator's toolkit container's work on a host-driver node: binaries, drop-in, validator markers."""
    files: dict[str, str | bytes] = {f"{TOOLKIT}/nvidia-cdi-hook": "#!/bin/sh\necho 'nvidia-cdi-hook 1.20.0'\n"}
    for name in OPERATOR_EXECUTABLES:
        files[f"{TOOLKIT}/{name}"] = WRAPPER.format(toolkit=TOOLKIT, name=name)
        files[f"{TOOLKIT}/{name}.real"] = f"#!/bin/sh\necho '{name} version 1.20.0'\n"
    return files | {
        "/etc/containerd/config.toml": (CORPUS / "gpu-operator-toolkit.toml").read_text(),
        OPERATOR_DROPIN: (CORPUS / "gpu-operator-toolkit+99-nvidia.toml").read_text(),
        "/run/nvidia/validations/driver-ready": HOST_DRIVER_READY, "/run/nvidia/validations/toolkit-ready": "",
    }  # fmt: skip


def driver_container() -> dict[str, str | bytes]:
    """The operator's driver container: its userspace only under its root; its validator's markers; the device
    plugin's spec from the driver before (the plugin was not restarted since)."""
    return {
        ROOT_LIBRARY: libnvidia_ml().read_bytes(),
        "/run/nvidia/validations/driver-ready": CONTAINER_DRIVER_READY,
        "/run/nvidia/validations/.driver-ctr-ready": "", "/run/nvidia/validations/toolkit-ready": "",
        PLUGIN_SPEC: device_plugin_spec(OLD_DRIVER),
    }  # fmt: skip


def refresh_units() -> dict[str, str | bytes]:
    """Toolkit 1.18's refresh units where its package installs them."""
    units = (SAMPLES / "nvidia-cdi-refresh-units-1.18.txt").read_text().split("#### ")[1:]
    return {f"/etc/systemd/system/{name}": text for name, _, text in (unit.partition("\n") for unit in units)}


def host_driver_for_the_refresh() -> dict[str, str | bytes]:
    """nvidia-smi on PATH (the refresh unit's ConditionPathExists), and its spec from the driver before."""
    return {"/usr/bin/nvidia-smi": "#!/bin/sh\ncat /sys/module/nvidia/version\n", REFRESH_SPEC: cdi_spec(OLD_DRIVER)}


# As the package's postinst, minus its start of the service (a spec stays the one from the driver before).
ENABLE_REFRESH = "systemctl daemon-reload && systemctl enable nvidia-cdi-refresh.path nvidia-cdi-refresh.service"
# A host driver's module in the running kernel's modules.dep (the refresh unit's ExecCondition).
MODULES_DEP = (
    "mkdir -p /lib/modules/$(uname -r) && echo 'kernel/drivers/video/nvidia.ko: "
    "kernel/drivers/video/nvidia-modeset.ko' > /lib/modules/$(uname -r)/modules.dep"
)


@pytest.fixture(scope="module")
def planted(fleet: Fleet) -> dict[str, str]:
    """The three nodes planted; op1's containerd signalled as the toolkit does and back under a new PID.
    Returns op1's PIDs before and after the SIGHUP."""
    fleet.reset(NODES)
    op1 = gpu_on_the_bus() | host_library() | host_toolkit() | operator_toolkit()
    link = {f"{TOOLKIT}/nvidia-container-toolkit": "nvidia-container-runtime-hook"}
    show = "systemctl show -p Restart -p MainPID --value containerd"
    restart, pid, hupped = plant(fleet, "op1", op1, f"{MOUNT_GPU} && ldconfig && {show} && {SIGHUP_AS_THE_TOOLKIT}",
                                 link).split()  # fmt: skip
    assert (restart, hupped) == ("always", pid)  # Debian's unit; the socket's peer is its main process
    root_link = {f"{ROOT_LIBRARY.rsplit('/', 1)[0]}/libnvidia-ml.so.1": ROOT_LIBRARY.rsplit("/", 1)[1]}
    # The host's toolkit is 1.18 on op2 too (this project installs it from NVIDIA's repository).
    op2 = gpu_on_the_bus() | host_toolkit() | refresh_units() | driver_container()
    plant(fleet, "op2", op2, f"{MOUNT_GPU} && {ENABLE_REFRESH}", root_link)
    op3 = gpu_on_the_bus() | host_library() | host_toolkit() | refresh_units() | host_driver_for_the_refresh()
    plant(fleet, "op3", op3, f"{MOUNT_GPU} && ldconfig && {MODULES_DEP} && {ENABLE_REFRESH}", {})
    # systemd starts it again after RestartSec (5 s)
    wait = f'until [ "$(systemctl show -p MainPID --value containerd)" != {hupped} ]; do sleep 0.1; done'
    back = sh(fleet, "op1", f"{wait} && ({CRI_STARTED}) && systemctl show -p MainPID --value containerd").strip()
    assert back not in ("", "0", hupped)
    return {"hupped": hupped, "back": back}


def inventory(fleet: Fleet, tmp_path: Path, order: tuple[str, ...]) -> Path:
    """The fleet's hosts in rollout ``order``."""
    path = tmp_path / "inventory.py"
    path.write_text(
        "import runpy\n"
        f"found = dict(runpy.run_path({str(fleet.inventory_path)!r})['hosts'])\n"
        f"hosts = [(name, found[name]) for name in {list(order)!r}]\n"
    )
    return path


def deploy(inventory_path: Path, deploy_file: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra("-y", *args, inventory_path, deploy_file)


RUNNING_CRI = (
    "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value containerd) "
    "| grep 'Start cri plugin'"
)


def nvidia_binary(cri_start: str) -> str | None:
    """The BinaryName of runtime nvidia in the running daemon's CRI start line."""
    found = re.search(r"[\[ ]nvidia:\{Type:[^}]*?BinaryName:([^\] ]+)", cri_start)
    return found.group(1) if found else None


def untouched(fleet: Fleet, node: str) -> list[str]:
    """containerd's PID, one hash over /etc and one over dpkg's state, and whether our drop-in exists."""
    pid = "systemctl show -p MainPID --value containerd"
    return reads(fleet, node, pid, "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum",
                 "find /var/lib/dpkg -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum",
                 f"test -e {OUR_DROPIN} && echo ours || echo none")  # fmt: skip


def links(report: Path, node: str) -> dict[str, dict[str, Any]]:
    found = {item["node"]: item for item in json.loads(report.read_text())["nodes"]}
    return {link["id"]: link for link in found[node]["links"]}


@pytest.fixture(scope="module")
def first_run(fleet: Fleet, planted: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """deploys/gpu_node.py on the three nodes with the readiness JSON."""
    tmp_path = tmp_path_factory.mktemp("first-run")
    before = untouched(fleet, "op1")
    report = tmp_path / "readiness.json"
    run = deploy(inventory(fleet, tmp_path, NODES), "deploys/gpu_node.py",
                 "--data", f"gpunode_readiness_json={report}")  # fmt: skip
    return {"run": run, "report": report, "op1_before": before, "op1_after": untouched(fleet, "op1")}


def test_a_node_whose_runtime_the_operators_toolkit_manages_is_refused_untouched(
    fleet: Fleet, planted: dict[str, str], first_run: dict[str, Any], tmp_path: Path
) -> None:
    # The toolkit's SIGHUP was a real restart: the daemon it started runs the operator's runtime.
    assert first_run["op1_before"][0].strip() == planted["back"]
    assert nvidia_binary(sh(fleet, "op1", RUNNING_CRI)) == f"{TOOLKIT}/nvidia-container-runtime"
    run = first_run["run"]
    assert run.returncode != 0, run.stdout
    refusal = f"the GPU Operator's toolkit manages the nvidia runtime on this node: {OPERATOR_DROPIN} " \
              f"(GPU Operator toolkit, BinaryName {TOOLKIT}/nvidia-container-runtime)"  # fmt: skip
    assert f"[op1] containerd config not changed: {refusal}" in run.stdout, run.stdout
    assert "`toolkit.enabled=false` in the operator's Helm values" in run.stdout
    assert (
        "not reached (failed before the rollout, at GPU Operator: host side handed over"
        in summary_rows(run.stdout)["op1"]
    )
    assert first_run["op1_after"] == first_run["op1_before"], "deploys/gpu_node.py changed op1"
    assert first_run["op1_before"][3] == "none\n"

    alone = deploy(inventory(fleet, tmp_path, ("op1",)), "deploys/containerd_runtime.py")
    assert alone.returncode != 0, alone.stdout
    assert refusal in alone.stdout and "gpunode_take_over_runtime: true" in alone.stdout
    assert untouched(fleet, "op1") == first_run["op1_before"], "deploys/containerd_runtime.py changed op1"


def test_a_driver_container_node_is_prepared_from_its_root(fleet: Fleet, first_run: dict[str, Any]) -> None:
    run = first_run["run"]
    row = summary_rows(run.stdout)["op2"]
    assert f"driver {DRIVER} from the GPU Operator's driver container ({DRIVER_ROOT}, userspace {DRIVER}): " \
           "driver packages untouched" in run.stdout, run.stdout  # fmt: skip
    assert "done" in row and "failed" not in row, row
    packages, holds, calls, spec, specs, cri, refresh = reads(
        fleet, "op2", "dpkg-query -W -f='${Package}\\n' 'nvidia*' 'libnvidia*' 2>/dev/null || true",
        "apt-mark showhold", f"cat {STAND_IN_LOG}", "cat /etc/cdi/nvidia.yaml",
        "find /etc/cdi /var/run/cdi -type f | sort", RUNNING_CRI,
        "systemctl start nvidia-cdi-refresh.service; journalctl -u nvidia-cdi-refresh.service -o cat",
    )  # fmt: skip
    assert packages == "" and "nvidia" not in holds, (packages, holds)
    # The spec generated from the container's root, the only nvidia one though the refresh units are
    # installed (systemd skips them here: they look for the driver on the host); the runtime loaded.
    assert f"cdi generate --format=yaml --driver-root={DRIVER_ROOT} " in calls, calls
    assert f"hostPath: {ROOT_LIBRARY}" in spec, spec
    assert specs.split() == ["/etc/cdi/nvidia.yaml", PLUGIN_SPEC], specs
    assert "skipped, no trigger condition checks were met" in refresh, refresh
    assert nvidia_binary(cri) == "/usr/bin/nvidia-container-runtime"

    found = links(first_run["report"], "op2")
    assert found["nvml"]["state"] == "ok", found["nvml"]
    assert f"(GPU Operator driver container, {DRIVER_ROOT})" in found["nvml"]["detail"]
    assert f"driver: GPU Operator driver container ({DRIVER_ROOT})" in found["owners"]["detail"]
    assert "validations: .driver-ctr-ready, driver-ready, toolkit-ready" in found["owners"]["detail"]
    assert found["cdi"]["state"] == "ok", found["cdi"]
    # The device plugin's spec pins the driver before: named, with the fix.
    stale = found["cdi_specs"]
    assert stale["state"] == "broken", stale
    assert f"{PLUGIN_SPEC} names driver {OLD_DRIVER} in its paths, but {DRIVER} is loaded" in stale["cause"]
    assert stale["fix"].startswith(f"{PLUGIN_SPEC}: restart the NVIDIA device plugin pod on this node"), stale


def test_where_the_refresh_units_are_installed_they_own_the_one_spec(fleet: Fleet, first_run: dict[str, Any]) -> None:
    row = summary_rows(first_run["run"].stdout)["op3"]
    assert "done" in row and "failed" not in row, row
    assert "CDI refresh: no start limit, CDI spec: current for the loaded driver" in row, row
    calls, spec, specs, result, limit = reads(
        fleet, "op3", f"cat {STAND_IN_LOG}", f"cat {REFRESH_SPEC}", "find /etc/cdi /var/run/cdi -type f || true",
        "systemctl show -p Result --value nvidia-cdi-refresh.service",
        "systemctl show -p StartLimitIntervalUSec --value nvidia-cdi-refresh.service",
    )  # fmt: skip
    # The stale spec made the deploy start the unit; systemd ran it, and it wrote its spec for the loaded
    # driver; the project wrote no spec of its own.
    assert f"cdi generate unit=systemd out={REFRESH_SPEC}" in calls, calls
    assert "--output=" not in calls, calls
    assert spec == cdi_spec()
    assert specs.split() == [REFRESH_SPEC], specs
    assert (result, limit) == ("success\n", "0\n")

    found = links(first_run["report"], "op3")
    assert found["cdi"]["state"] == "ok" and REFRESH_SPEC in found["cdi"]["detail"], found["cdi"]
    assert found["cdi_specs"]["state"] == "ok", found["cdi_specs"]
    assert found["cdi_specs"]["detail"] == "1 spec(s) true (priority /etc/cdi < /var/run/cdi)"


def test_take_over_loads_our_runtime_last_and_the_report_names_both_writers(
    fleet: Fleet, first_run: dict[str, Any], tmp_path: Path
) -> None:
    operator_file = sh(fleet, "op1", f"cat {OPERATOR_DROPIN}")
    report = tmp_path / "readiness.json"
    run = deploy(inventory(fleet, tmp_path, ("op1",)), "deploys/gpu_node.py",
                 "--data", "gpunode_take_over_runtime=true", "--data", f"gpunode_readiness_json={report}")  # fmt: skip
    assert run.returncode == 0, run.stdout
    assert "[op1] plan: gpunode_take_over_runtime: gpunode's nvidia runtime " \
           f"({OUR_DROPIN}) loads after the GPU Operator's {OPERATOR_DROPIN}" in run.stdout, run.stdout  # fmt: skip
    kept, config, dump, cri, ended = reads(
        fleet, "op1", f"cat {OPERATOR_DROPIN}", "cat /etc/containerd/config.toml", "containerd config dump",
        RUNNING_CRI, "journalctl -u containerd -o short-iso-precise | grep -m 1 'Deactivated successfully'",
    )  # fmt: skip
    assert kept == operator_file  # nothing of the operator's removed
    imports = re.search(r"^imports = (.*)$", config, re.M)
    assert imports is not None and json.loads(imports.group(1))[-1] == OUR_DROPIN, config
    # The node's own containerd: its merged config and the running daemon have our runtime.
    nvidia = re.search(r'runtimes\.nvidia\.options\]\n(?:.*\n)*?\s*BinaryName = "([^"]*)"', dump)
    assert nvidia is not None and nvidia.group(1) == "/usr/bin/nvidia-container-runtime", dump
    assert nvidia_binary(cri) == "/usr/bin/nvidia-container-runtime", cri

    found = links(report, "op1")
    writers = found["runtime_writers"]
    assert writers["state"] == "broken", writers
    assert f"{OPERATOR_DROPIN} (GPU Operator toolkit, BinaryName {TOOLKIT}/nvidia-container-runtime)" \
           in writers["cause"]  # fmt: skip
    assert f"{OUR_DROPIN} (gpunode, BinaryName /usr/bin/nvidia-container-runtime)" in writers["cause"]
    assert f"`toolkit.enabled=false` in the GPU Operator's Helm values (then remove {OPERATOR_DROPIN})" \
           in writers["fix"]  # fmt: skip
    # The toolkit's SIGHUP, when systemd saw the daemon end, tied to the operator's toolkit.
    hup = f"containerd was sent SIGHUP 1 time(s) (last {ended.split()[0]}): the GPU Operator's toolkit ({TOOLKIT})"
    assert hup in writers["cause"], writers
    assert hup in found["containerd_restarts"]["cause"], found["containerd_restarts"]
