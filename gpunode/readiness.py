"""Readiness of a GPU node: the chain from PCI device to device plugin, each link's state, and for
the first broken link its cause and fix (no I/O).

The input is what ``pyinfra_gpunode.facts.readiness.NodeReadiness`` returns. A node is ready when
no link is broken; ``unknown`` links (nothing to read them from) do not make it unready.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any, cast

from pyinfra_gpunode import node_toml
from pyinfra_gpunode.cdi_checks import missing_devices, priority_dirs, untrue_specs
from pyinfra_gpunode.containerd_dropin import CRI_V2, CRI_V3_RUNTIME, RUNC_V2, RUNTIME
from pyinfra_gpunode.containerd_dump import CTR, nri_state
from pyinfra_gpunode.containerd_files import ConfigFile
from pyinfra_gpunode.containerd_losses import lost_settings
from pyinfra_gpunode.containerd_support import support_warning
from pyinfra_gpunode.driver_skew import skew_warnings
from pyinfra_gpunode.driver_versions import same_driver, upstream_version
from pyinfra_gpunode.gpu_queries import NVML_SECONDS, SMI_SECONDS
from pyinfra_gpunode.log import without_controls
from pyinfra_gpunode.operator import (
    DRIVER_ROOT,
    OPERATOR,
    TOOLKIT_DIR,
    TOOLKIT_OFF,
    config_texts,
    container_userspace,
    driver_from_container,
    driver_owner,
    owners_text,
    runtime_writers,
    toolkit_owner,
    under_toolkit_dir,
)
from pyinfra_gpunode.persistence import readiness_problem, wanted
from pyinfra_gpunode.platform import NAMES, RANCHER
from pyinfra_gpunode.settings import CONTAINERD_MODE, PERSISTENCE_MODE, RUNTIME_HANDLER

if TYPE_CHECKING:
    from pyinfra_gpunode.facts.readiness import NodeReadinessInfo

OK, BROKEN, NOT_APPLICABLE, UNKNOWN = "ok", "broken", "n/a", "unknown"
VALIDATIONS_DIR = "/run/nvidia/validations"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# Xid codes NVIDIA's catalogue attributes to the application, not the GPU or the node.
WORKLOAD_XIDS = frozenset({13, 31, 43, 45})
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]*)\): (?P<code>\d+)")
RUNTIME_DEPLOY = "pyinfra -y INVENTORY deploys/containerd_runtime.py"
NRI_MODE = "NRI mode (gpunode_containerd_mode: nri)"


@dataclass
class Link:
    """One link of the chain: its state, what was found, and (when broken) why and what to do."""

    id: str
    title: str
    state: str
    detail: str
    cause: str | None = None
    fix: str | None = None


@dataclass
class NodeReadiness:
    node: str
    links: list[Link]
    versions: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what is worth knowing but breaks no link
    read_at: str | None = None  # when the node was read (ISO 8601, UTC; the controller's clock)

    @property
    def first_broken(self) -> Link | None:
        return next((link for link in self.links if link.state == BROKEN), None)

    @property
    def ready(self) -> bool:
        return self.first_broken is None

    def as_dict(self) -> dict[str, Any]:
        first = self.first_broken
        return {
            "node": self.node,
            "ready": self.ready,
            "first_broken": first.id if first else None,
            "cause": first.cause if first else None,
            "fix": first.fix if first else None,
            "versions": self.versions,
            "warnings": self.warnings,
            "read_at": self.read_at,
            "links": [asdict(link) for link in self.links],
        }


def _link(id: str, title: str) -> Callable[..., Link]:
    def make(state: str, detail: str, cause: str | None = None, fix: str | None = None) -> Link:
        return Link(id, title, state, detail, cause, fix)

    return make


# ---- GPU side ---------------------------------------------------------------------------------


def _pci(facts: NodeReadinessInfo) -> Link:
    make = _link("pci", "NVIDIA GPU on the PCI bus")
    pci = facts["host"]["pci"]
    gpus = pci["gpus"]
    if not gpus:
        return make(NOT_APPLICABLE, "no NVIDIA GPU (vendor 0x10de, class 0x0300/0x0302) on the PCI bus")
    listed = ", ".join(f"{gpu['address']} ({gpu['device']})" for gpu in gpus)
    switches = f"; {len(pci['nvswitches'])} NVSwitch" if pci["nvswitch"] else ""
    return make(OK, f"{len(gpus)} GPU: {listed}{switches}")


def _module(facts: NodeReadinessInfo) -> Link:
    make = _link("module", "kernel module loaded")
    host = facts["host"]
    driver = host["driver"]
    if driver["loaded"]:
        flavor = f" ({driver['module_flavor']})" if driver["module_flavor"] else ""
        return make(OK, f"nvidia {driver['kernel_module_version']}{flavor} loaded")
    kernel = host["kernel"] or "the running kernel"
    installed = driver["userspace_version"]
    if not installed and not any("nvidia" in name for name in host["packages"]):
        return make(
            BROKEN, "no NVIDIA driver installed",
            cause="no NVIDIA driver is installed: no nvidia module is loaded and no libnvidia-ml.so.1 is in the "
            "loader cache",
            fix="install the driver: run deploys/gpu_node.py with gpunode_driver_branch or gpunode_driver_version set",
        )  # fmt: skip
    if not host["module_built"]:
        return make(
            BROKEN, f"no nvidia module for kernel {kernel}",
            cause=f"the nvidia module is not loaded and /lib/modules/{kernel} has no nvidia*.ko: "
            f"no module was built or installed for the running kernel",
            fix=f"check `dkms status` and install the module for {kernel} (the kernel's linux-headers and the "
            f"driver's DKMS or precompiled module package), then `modprobe nvidia`",
        )  # fmt: skip
    return make(
        BROKEN, "nvidia module not loaded",
        cause=f"the nvidia module for {kernel} is installed (userspace {installed or 'unknown'}) but not loaded: "
        "/sys/module/nvidia/version is absent",
        fix="reboot the node, or run `modprobe nvidia` and read `dmesg | grep -i nvrm` for why it does not load "
        "(Secure Boot signature, nouveau holding the GPU)",
    )  # fmt: skip


def _nvml_error_fix(error: str) -> str:
    fixes = {
        "DriverNotLoaded": "load the module: `modprobe nvidia` (or reboot), then `nvidia-smi`",
        "NoPermission": "run as root or fix the mode of /dev/nvidiactl and /dev/nvidia[0-9]*",
        "GpuIsLost": "drain the node and reboot it; if it recurs, check the GPU's power and PCIe seating",
        "LibraryNotFound": "install the driver's userspace (libnvidia-ml.so.1) and run `ldconfig`",
    }
    return fixes.get(error, f"run `nvidia-smi` and read `dmesg | grep -i nvrm` for NVML's {error}")


def _reboot_pending(module: str, library: str | None, detail: str) -> Link:
    return _link("nvml", USERSPACE_TITLE)(
        BROKEN, detail,
        cause=f"reboot pending after an upgrade: the loaded module is {module} but the userspace library is "
        f"{'libnvidia-ml.so.' + library if library else 'of another version'}, so NVML fails with LibRmVersionMismatch",
        fix="drain the node and reboot it (deploys/gpu_node.py does it with gpunode_reboot: true); "
        "hold the driver packages so it does not recur",
    )  # fmt: skip


USERSPACE_TITLE = "userspace library and NVML at the module's version"


def _userspace(facts: NodeReadinessInfo) -> Link:
    make = _link("nvml", USERSPACE_TITLE)
    driver = facts["host"]["driver"]
    nvml = facts["nvml"]
    error = nvml["error"] if nvml else None
    module = driver["kernel_module_version"]
    # The resolved library's file name carries the version, unless it is a plain file: then NVML's word;
    # on a driver-container node, the library in the GPU Operator's driver root.
    library = driver["userspace_version"] or (nvml["driver_version"] if nvml and not error else None)
    container = driver_from_container(driver, _operator(facts))
    library = library or (container_userspace(_operator(facts)) if container else None)
    if not module:
        return make(UNKNOWN, f"userspace {library or 'not found'}; no module loaded to compare with")
    if library and not same_driver(module, library):
        named = f"; NVML: {error}" if error else ""
        return _reboot_pending(module, library, f"module {module}, library {library}{named}")
    if error == "LibRmVersionMismatch":
        return _reboot_pending(module, library, f"module {module}; NVML: {error}")
    wedged = [what for what, hung in (("NVML", error == "Timeout"), ("nvidia-smi", driver["nvidia_smi_hung"])) if hung]
    if wedged:
        return make(
            BROKEN, f"module {module}: {' and '.join(wedged)} did not answer",
            cause=f"{' and '.join(wedged)} did not answer in time (nvidia-smi {SMI_SECONDS} s, NVML {NVML_SECONDS} s) "
            f"with module {module} loaded: a GPU or the driver is wedged (the query is left behind on the node)",
            fix="drain the node; read `dmesg | grep -i -e nvrm -e xid`; reset the GPU (`nvidia-smi -r`) or reboot",
        )  # fmt: skip
    if error:
        return make(
            BROKEN, f"module {module}, library {library or 'unknown'}; NVML: {error}",
            cause=f"the nvidia {module} module is loaded but NVML fails with {error}",
            fix=_nvml_error_fix(error),
        )  # fmt: skip
    if not library and not driver["nvidia_smi_ok"]:
        return make(
            BROKEN, f"module {module}, no libnvidia-ml.so.1",
            cause=f"module {module} is loaded but the loader cache (`ldconfig -p`) has no versioned "
            "libnvidia-ml.so.1 and neither NVML nor nvidia-smi answers",
            fix=f"install the driver's userspace for {module} (libnvidia-ml.so.{module}) and run `ldconfig`",
        )  # fmt: skip
    if nvml is None:
        how = "nvidia-smi works" if driver["nvidia_smi_ok"] else "NVML not queried (no pynvml on the node)"
        where = f" (GPU Operator driver container, {DRIVER_ROOT})" if container else ""
        return make(OK, f"module and library {library or module}{where}; {how}")
    seen, gpus = len(nvml["devices"]), len(facts["host"]["pci"]["gpus"])
    if seen < gpus:
        return make(
            BROKEN, f"NVML sees {seen} of {gpus} GPUs",
            cause=f"NVML lists {seen} GPU(s) but the PCI bus has {gpus}: a GPU is lost or held by another driver",
            fix="run `nvidia-smi -q` and `dmesg | grep -i -e nvrm -e xid`; drain and reboot the node if a GPU "
            "fell off the bus",
        )  # fmt: skip
    versions = f"NVML {nvml['nvml_version']}, CUDA {nvml['cuda_driver_version']}"
    return make(OK, f"module and library {library}; {versions}, {seen} GPU(s)")


def _xid(facts: NodeReadinessInfo) -> Link:
    make = _link("xid", "no GPU Xid errors in the kernel log since boot")
    xid = facts["xid"]
    if xid["source"] is None:
        return make(UNKNOWN, "kernel log not readable (no journal kernel messages, dmesg refused)")
    codes = sorted({int(match.group("code")) for line in xid["lines"] if (match := _XID.search(line))})
    if not xid["count"]:
        return make(OK, f"none ({xid['source']})")
    serious = [code for code in codes if code not in WORKLOAD_XIDS]
    summary = f"{xid['count']} Xid line(s) since boot, codes {', '.join(map(str, codes)) or 'unknown'}"
    if codes and not serious:
        return make(OK, f"{summary}: workload errors only")
    last = xid["lines"][-1].strip() if xid["lines"] else ""
    return make(
        BROKEN, summary,
        cause=f"the kernel log ({xid['source']}) has {summary}; last: {last}",
        fix="drain the node, look the code up in NVIDIA's Xid catalogue and run `nvidia-smi -q`; "
        "79, 74, 48, 94 and 95 need a GPU reset or a reboot",
    )  # fmt: skip


def _fabric_manager(facts: NodeReadinessInfo) -> Link:
    make = _link("fabric_manager", "Fabric Manager active at the driver's version (NVSwitch)")
    host = facts["host"]
    if not host["pci"]["nvswitch"]:
        return make(NOT_APPLICABLE, "no NVSwitch")
    fm = host["fabric_manager"]
    module = host["driver"]["kernel_module_version"]
    version = upstream_version(fm["version"]) if fm["version"] else None
    if version is None and driver_from_container(host["driver"], _operator(facts)):
        return make(UNKNOWN, f"no host Fabric Manager: the GPU Operator's driver container ({DRIVER_ROOT}) runs it")
    if version is None:
        return make(
            BROKEN, "not installed",
            cause="this NVSwitch node has no nvidia-fabricmanager package, so its GPUs cannot form the NVLink fabric",
            fix=f"install nvidia-fabricmanager at driver {module or 'the loaded driver'}'s version and enable "
            "nvidia-fabricmanager.service (deploys/gpu_node.py does both)",
        )  # fmt: skip
    if module and not same_driver(version, module):
        return make(
            BROKEN, f"Fabric Manager {version}, driver {module}",
            cause=f"Fabric Manager {version} does not match the loaded driver {module}; it refuses to start "
            "('fabric manager NVIDIA GPU driver interface version … don't match')",
            fix=f"install nvidia-fabricmanager {module} and hold it with the driver, then "
            "`systemctl restart nvidia-fabricmanager`",
        )  # fmt: skip
    if fm["active"] is None:
        return make(UNKNOWN, f"Fabric Manager {version}; service state unknown (no systemd)")
    if fm["active"] != "active":
        return make(
            BROKEN, f"Fabric Manager {version} {fm['active']}",
            cause=f"nvidia-fabricmanager.service is {fm['active']} (enabled: {fm['enabled']}) on an NVSwitch node",
            fix="`systemctl enable --now nvidia-fabricmanager` and read `journalctl -u nvidia-fabricmanager -b` "
            "if it does not stay active",
        )  # fmt: skip
    return make(OK, f"Fabric Manager {version} active")


def _toolkit(facts: NodeReadinessInfo, binary: str, nri: bool = False) -> Link:
    make = _link("toolkit", "NVIDIA Container Toolkit installed")
    toolkit = facts["toolkit"]
    if nri:  # no runtime runs the toolkit's binary: nvidia-ctk, for the CDI spec, is what counts
        return _toolkit_nri(make, toolkit["ctk_version"], set(_operator(facts)["toolkit_binaries"]))
    present = facts["containerd"]["binary_present"] or toolkit["runtime_binary"] == binary
    ctk = toolkit["ctk_version"]
    operator = set(_operator(facts)["toolkit_binaries"])
    if {"nvidia-container-runtime", "nvidia-ctk"} <= operator and (under_toolkit_dir(binary) or not present):
        return make(OK, f"{OPERATOR} in {TOOLKIT_DIR}: {', '.join(sorted(operator))}")
    if not present:
        return make(
            BROKEN, f"{binary} missing" + (f"; nvidia-ctk {ctk}" if ctk else "; no nvidia-ctk"),
            cause=f"the nvidia runtime binary {binary} is missing"
            + ("" if ctk else " and nvidia-ctk is not installed"),
            fix="install nvidia-container-toolkit (deploys/gpu_node.py with gpunode_toolkit_source), "
            "or set gpunode_nvidia_runtime_binary to where it is",
        )  # fmt: skip
    if not ctk:
        return make(
            BROKEN, f"{binary} present, no nvidia-ctk",
            cause="nvidia-ctk is not installed, so no CDI spec can be generated",
            fix="install nvidia-container-toolkit-base (deploys/gpu_node.py installs all four toolkit packages)",
        )  # fmt: skip
    return make(OK, f"nvidia-ctk {ctk}, {binary}")


def _toolkit_nri(make: Callable[..., Link], ctk: str | None, operator: set[str]) -> Link:
    if ctk:
        return make(OK, f"nvidia-ctk {ctk} ({NRI_MODE}: no runtime binary used)")
    if "nvidia-ctk" in operator:
        return make(OK, f"{OPERATOR} in {TOOLKIT_DIR}: nvidia-ctk ({NRI_MODE})")
    return make(
        BROKEN, "no nvidia-ctk",
        cause="nvidia-ctk is not installed, so no CDI spec can be generated, and in NRI mode GPUs reach pods only "
        "through CDI",
        fix="install nvidia-container-toolkit-base (deploys/gpu_node.py installs all four toolkit packages)",
    )  # fmt: skip


def _cdi(facts: NodeReadinessInfo, spec_path: str) -> Link:
    make = _link("cdi", "CDI spec current for the loaded driver, listing every GPU")
    module = facts["host"]["driver"]["kernel_module_version"]
    gpus = len(facts["host"]["pci"]["gpus"])
    specs = [spec for spec in facts["cdi"] if not spec["device_plugin"]]
    chosen = (
        next((spec for spec in specs if spec["path"] == spec_path), None)
        or next((spec for spec in specs if spec["kind"] == "nvidia.com/gpu"), None)
        or next((spec for spec in specs if spec["error"] and "nvidia" in spec["path"]), None)
    )
    generate = f"`nvidia-ctk cdi generate --output={spec_path}` (deploys/gpu_node.py regenerates it)"
    if chosen is None:
        return make(
            BROKEN, "no nvidia.com/gpu spec",
            cause="no CDI spec of kind nvidia.com/gpu in /etc/cdi or /var/run/cdi "
            "(/var/run/cdi is emptied at every boot)",
            fix=f"generate it: {generate}",
        )  # fmt: skip
    path = chosen["path"]
    if chosen["error"]:
        return make(BROKEN, f"{path} unreadable", cause=chosen["error"], fix=f"move {path} away, then {generate}")
    if not module:
        return make(UNKNOWN, f"{path} for driver {chosen['driver_version']}; no module loaded to compare with")
    if not same_driver(chosen["driver_version"], module):
        return make(
            BROKEN, f"{path} for driver {chosen['driver_version']}, module {module}",
            cause=f"{path} was generated for driver {chosen['driver_version'] or 'unknown'} but {module} is loaded: "
            "its library paths no longer exist and containers fail to start",
            fix=f"regenerate it for {module}: {generate}",
        )  # fmt: skip
    missing = missing_devices(chosen, gpus)
    if missing:
        return make(
            BROKEN, f"{path} lacks device(s) {', '.join(missing)}",
            cause=f"{path} lists devices {', '.join(chosen['devices']) or 'none'} but the node has {gpus} GPU(s): "
            f"{', '.join(missing)} missing",
            fix=f"regenerate it now that every GPU is visible: {generate}",
        )  # fmt: skip
    return make(OK, f"{path}: driver {module}, {len(chosen['devices'])} device names")


def _cdi_specs(facts: NodeReadinessInfo) -> Link:
    make = _link("cdi_specs", "every CDI spec true: driver, device nodes, format, one definition per device")
    specs = facts["cdi"]
    containerd = facts["containerd"]
    summary = containerd["dump"]["summary"] if containerd["dump"] else None
    spec_dirs = summary["cdi_spec_dirs"] if summary else None
    problems = untrue_specs(
        specs,
        facts["host"]["driver"]["kernel_module_version"],
        facts.get("dev_nodes"),
        containerd["version"],
        spec_dirs,
    )
    order = " < ".join(priority_dirs(spec_dirs))
    if not problems:
        return make(OK, f"{len(specs)} spec(s) true (priority {order})" if specs else "no CDI spec")
    named = "; ".join(f"{problem.path} {problem.problem}" for problem in problems)
    return make(
        BROKEN, f"{len(problems)} of {len(specs)} spec(s) stale or shadowed: {', '.join(p.path for p in problems)}",
        cause=f"{named} (directory priority {order}, the last wins)",
        fix="; ".join(f"{problem.path}: {problem.fix}" for problem in problems),
    )  # fmt: skip


# ---- containerd side --------------------------------------------------------------------------


def _defines_nvidia(config: dict[str, Any]) -> bool:
    if not config.get("text"):
        return False
    try:
        data = node_toml.loads(config["text"])
    except tomllib.TOMLDecodeError:
        return False
    plugins = data.get("plugins", {})
    for name in (CRI_V2, CRI_V3_RUNTIME):
        table = plugins.get(name, {}) if isinstance(plugins, dict) else {}
        if RUNTIME in table.get("containerd", {}).get("runtimes", {}):
            return True
    return False


def _load_order(files: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [file for file in [files["main"], *files["imported"]] if file]


def shadowing_file(files: Mapping[str, Any], major: int) -> tuple[str, str] | None:
    """On containerd 1.x, ``(file that defines nvidia, later file that replaces the CRI section)``."""
    if major >= 2:
        return None
    order = _load_order(files)
    definers = [i for i, file in enumerate(order) if _defines_nvidia(file)]
    owners = [i for i, file in enumerate(order) if CRI_V2 in file["plugins"]]
    if not definers or not owners or owners[-1] <= definers[-1]:
        return None
    return order[definers[-1]]["path"], order[owners[-1]]["path"]


def _containerd_config(facts: NodeReadinessInfo, nri: bool = False) -> Link:
    title = "NRI and CDI on in containerd's merged config" if nri else "nvidia runtime in containerd's merged config"
    make = _link("containerd_config", title)
    state = facts["containerd"]
    version = state["version"]
    if version is None:
        return make(
            BROKEN, "containerd not installed",
            cause="containerd is not installed (`containerd --version` not found)",
            fix="install containerd, then register the runtime: " + RUNTIME_DEPLOY,
        )  # fmt: skip
    dump = state["dump"]
    main = state["files"]["main_path"]
    if dump is None or dump["error"]:
        error = (dump["error"] if dump else None) or "no output"
        return make(
            BROKEN, f"containerd {version['raw']}: config does not load",
            cause=f"`containerd --config {main} config dump` fails: {error.strip().splitlines()[-1]}",
            fix="fix the file the error names; containerd cannot start on this config",
        )  # fmt: skip
    summary = dump["summary"]
    assert summary is not None  # a dump without an error has its summary
    if nri:
        return _nri_config(make, version["raw"], dump["dump"], summary["enable_cdi"])
    if RUNTIME in summary["runtimes"]:
        binary = summary["runtimes"][RUNTIME]["BinaryName"]
        return make(OK, f"containerd {version['raw']}: nvidia ({binary}), default {summary['default_runtime_name']}")
    shadow = shadowing_file(state["files"], version["major"])
    if shadow:
        definer, owner = shadow
        return make(
            BROKEN, f"containerd {version['raw']}: nvidia shadowed by {owner}",
            cause=f"{definer} defines the nvidia runtime but {owner}, loaded after it, also sets the CRI plugin and "
            f"containerd {version['major']}.{version['minor']} keeps only the last file's CRI section",
            fix=f"run {RUNTIME_DEPLOY}: it loads the nvidia runtime last, carrying {owner}'s settings",
        )  # fmt: skip
    return make(
        BROKEN, f"containerd {version['raw']}: no nvidia runtime",
        cause=f"no config file loaded from {main} defines the nvidia runtime",
        fix=f"register it: {RUNTIME_DEPLOY} (or `nvidia-ctk runtime configure --runtime=containerd`)",
    )  # fmt: skip


def _nri_config(make: Callable[..., Link], raw: str, dump: dict[str, Any], enable_cdi: bool | None) -> Link:
    """NRI mode: the merged config has containerd's NRI plugin on and CDI on (no nvidia runtime needed)."""
    on, why = nri_state(dump)
    deploy = f"{RUNTIME_DEPLOY} with gpunode_containerd_mode: nri"
    if on is None:
        return make(
            BROKEN, f"containerd {raw}: no NRI plugin",
            cause=f"{NRI_MODE} needs containerd's NRI plugin, and {why}",
            fix="upgrade containerd to 1.7 or later, or use gpunode_containerd_mode: runtime on this node",
        )  # fmt: skip
    if not on:
        return make(
            BROKEN, f"containerd {raw}: NRI off ({why})",
            cause=f"{NRI_MODE}: containerd's merged config has NRI off ({why}), so the GPU Operator's NRI plugin "
            "cannot connect and GPU pods get no devices",
            fix=f"remove the setting from the file that makes it, or set gpunode_enable_nri: true; then run {deploy}",
        )  # fmt: skip
    if enable_cdi is not True:
        return make(
            BROKEN, f"containerd {raw}: NRI on, enable_cdi {str(enable_cdi).lower()}",
            cause=f"{NRI_MODE}: containerd's merged config has enable_cdi = {str(enable_cdi).lower()}, so the CDI "
            "devices the GPU Operator's NRI plugin asks for are not injected",
            fix=f"remove the setting from the file that makes it, or set gpunode_enable_cdi: true; then run {deploy}",
        )  # fmt: skip
    return make(OK, f"containerd {raw}: NRI on, enable_cdi true ({NRI_MODE}: no nvidia runtime needed)")


_NO_OPERATOR: dict[str, Any] = {
    "toolkit_binaries": [], "driver_root_library": None, "validations": None, "driver_ready": {}, "dropin": None,
}  # fmt: skip


def _operator(facts: NodeReadinessInfo) -> Mapping[str, Any]:
    """What the GPU Operator left on the node (nothing, for facts read without it)."""
    return facts.get("operator") or _NO_OPERATOR


def _writers(facts: NodeReadinessInfo, handler: str) -> list[Any]:
    containerd, operator = facts["containerd"], _operator(facts)
    return runtime_writers(
        config_texts(containerd["files"], operator), handler, operator, containerd["platform"]["name"]
    )


def _owners(facts: NodeReadinessInfo, handler: str) -> Link:
    make = _link("owners", "who owns each layer: driver, toolkit, runtime, validations")
    host, operator = facts["host"], _operator(facts)
    driver = driver_owner(host["driver"], operator, host["packages"])
    toolkit = toolkit_owner(facts["toolkit"], operator)
    return make(OK, owners_text(driver, toolkit, _writers(facts, handler), operator["validations"], handler))


def _sighups(facts: NodeReadinessInfo) -> list[str]:
    journal = facts["containerd_journal"]
    return [event["time"] for event in journal["signals"] if event["signal"] == "SIGHUP"] if journal else []


def _operator_sighups(facts: NodeReadinessInfo) -> str:
    """The SIGHUP restarts of containerd tied to the operator's toolkit, when it is on the node."""
    hups = _sighups(facts)
    if not hups or not _operator(facts)["toolkit_binaries"]:
        return ""
    return (
        f"; containerd was sent SIGHUP {len(hups)} time(s) (last {hups[-1]}): the GPU Operator's toolkit "
        f"({TOOLKIT_DIR}) restarts containerd with SIGHUP each time it writes its drop-in"
    )


def _runtime_writers(facts: NodeReadinessInfo, handler: str) -> Link:
    make = _link("runtime_writers", f"one writer of the {handler} runtime")
    if facts["containerd"]["version"] is None:
        return make(NOT_APPLICABLE, "containerd not installed")
    writers = _writers(facts, handler)
    if not writers:
        return make(OK, f"no file defines runtime {handler}")
    listed = "; ".join(writer.describe() for writer in writers)
    kinds = {writer.writer for writer in writers}
    if len(kinds) < 2 or OPERATOR not in kinds:
        return make(OK, listed)
    second = next(writer for writer in writers if writer.writer != OPERATOR)
    operator = next(writer for writer in writers if writer.writer == OPERATOR)
    return make(
        BROKEN, f"{len(writers)} files define {handler}: {listed}",
        cause=f"two writers define the {handler} runtime: {operator.describe()} and {second.describe()}; "
        f"the operator rewrites its file while the other is kept, and the one containerd loads last wins"
        + _operator_sighups(facts),
        fix=f"give the runtime one owner: `{TOOLKIT_OFF}` in the GPU Operator's Helm values (then remove "
        f"{operator.path}) so gpunode owns it, or remove {second.path} so the operator does",
    )  # fmt: skip


def _runtime_handler(facts: NodeReadinessInfo, handler: str, binary: str, nri: bool = False) -> Link:
    make = _link("runtime_handler", f"RuntimeClass handler {handler} runs the toolkit's runtime")
    if nri:
        return make(NOT_APPLICABLE, f"{NRI_MODE}: no RuntimeClass handler; the GPU Operator's NRI plugin injects GPUs")
    state = facts["containerd"]
    summary = state["dump"]["summary"] if state["dump"] and not state["dump"]["error"] else None
    if state["version"] is None or summary is None:
        return make(UNKNOWN, "no merged containerd config to read")
    runtime = summary["runtimes"].get(handler)
    if runtime is None:
        return make(
            BROKEN, f"no runtime {handler}",
            cause=f"containerd's merged config has no runtime named {handler} (it has "
            f"{', '.join(summary['runtimes']) or 'none'}): pods of a RuntimeClass with handler {handler} fail "
            f"with 'no runtime for \"{handler}\" is configured'",
            fix=f"set gpunode_runtime_handler to the RuntimeClass's handler, or define runtime {handler}; "
            f"then run {RUNTIME_DEPLOY}",
        )  # fmt: skip
    found = runtime["BinaryName"]
    toolkit = found == binary or posixpath.basename(found or "").startswith("nvidia-container-runtime")
    if not toolkit:
        return make(
            BROKEN, f"{handler}: BinaryName {found or 'unset'}",
            cause=f"runtime {handler} runs {found or 'plain runc (no BinaryName)'}, not the toolkit's {binary}: "
            "its containers get no GPU",
            fix=f"set gpunode_nvidia_runtime_binary to the toolkit's binary and run {RUNTIME_DEPLOY}",
        )  # fmt: skip
    note = "" if found == binary else f" (gpunode_nvidia_runtime_binary is {binary})"
    mismatch = cgroup_mismatch(summary, handler)
    if mismatch:
        return make(
            BROKEN, f"{handler}: {found}; {mismatch}",
            cause=f"runtime {handler} and the default runtime use different cgroup drivers ({mismatch}): the "
            f"kubelet's driver is the default runtime's, so the {handler} runtime's pods run in cgroups the kubelet "
            "does not manage and are killed or lose their GPUs (NVML 'Failed to initialize') after a systemd reload",
            fix=_cgroup_fix(facts, handler),
        )  # fmt: skip
    return make(OK, f"{handler}: {found}{note}")


def cgroup_mismatch(summary: Mapping[str, Any], handler: str) -> str | None:
    """How runtime ``handler``'s ``SystemdCgroup`` differs from the default runtime's in a dump summary,
    where both run runc (``io.containerd.runc.v2``; an unset value is runc's default, false); else None."""
    default_name = summary["default_runtime_name"]
    runtimes = summary["runtimes"]
    runtime, default = runtimes.get(handler), runtimes.get(default_name)
    if not runtime or not default or default_name == handler:
        return None
    if {runtime["runtime_type"], default["runtime_type"]} != {RUNC_V2}:
        return None
    ours, theirs = bool(runtime["SystemdCgroup"]), bool(default["SystemdCgroup"])
    if ours == theirs:
        return None
    return f"SystemdCgroup {str(ours).lower()}, default runtime {default_name}: SystemdCgroup {str(theirs).lower()}"


def _cgroup_fix(facts: NodeReadinessInfo, handler: str) -> str:
    platform = facts["containerd"]["platform"]["name"]
    if platform in RANCHER:
        name = NAMES[platform]
        return (
            f"{name} releases before October 2023 (k3s-io/k3s#8470) do not pass SystemdCgroup to the nvidia "
            f"runtimes they add: upgrade {name} (its unit restarts and writes its config afresh)"
        )
    return (
        f"set host data gpunode_nvidia_systemd_cgroup to the default runtime's value (a file sets {handler}'s, "
        f"and gpunode keeps it unless told), then run {RUNTIME_DEPLOY}"
    )


def _unit(facts: NodeReadinessInfo) -> tuple[str, str]:
    """The unit containerd runs in, as the report names it and as commands name it: containerd.service, or
    the unit of the platform that runs it (k3s-agent.service, k0sworker.service, ...)."""
    unit = facts.get("containerd_unit") or "containerd.service"
    return unit, "containerd" if unit == "containerd.service" else unit


def _newer_files(state: Mapping[str, Any]) -> list[str]:
    started = state["service"]["started_at"] or 0
    mtimes = state["files"]["mtimes"]
    return sorted((path for path, mtime in mtimes.items() if mtime >= int(started)), key=lambda p: -mtimes[p])


def _containerd_running(facts: NodeReadinessInfo, nri: bool = False) -> Link:
    title = "running containerd loaded its CRI plugin" if nri else "running containerd loaded the nvidia runtime"
    make = _link("containerd_running", title)
    state, cri = facts["containerd"], facts["cri"]
    service = state["service"]
    label, unit = _unit(facts)
    if state["version"] is None:
        return make(UNKNOWN, "containerd not installed")
    if service is None:
        return make(UNKNOWN, "no systemd: the running daemon cannot be read")
    if service["active_state"] != "active":
        return make(
            BROKEN, f"{label} {service['active_state']} ({service['result'] or 'no result'})",
            cause=f"{label} is {service['active_state']}/{service['sub_state']} "
            f"(result {service['result'] or 'unknown'}): kubelet has no container runtime",
            fix=f"read `journalctl -u {unit} -b -n 50`, fix the cause, then `systemctl reset-failed {unit} "
            f"&& systemctl start {unit}`",
        )  # fmt: skip
    if cri is None:
        return make(UNKNOWN, f"containerd active (PID {service['main_pid']}); no journal to read the CRI plugin from")
    if not cri["loaded"]:
        if cri["error"]:
            return make(
                BROKEN, "CRI plugin failed to load",
                cause=f"the running containerd (PID {service['main_pid']}) failed to load its CRI plugin: "
                f"{cri['error']}",
                fix=f"fix the config the error names, then `systemctl restart {unit}` (or {RUNTIME_DEPLOY})",
            )  # fmt: skip
        return make(UNKNOWN, f"containerd active (PID {service['main_pid']}); no CRI start line in its journal")
    pending = service["restart_pending"]
    if nri:
        return _running_nri(make, service, cri, pending, _newer_files(state) if pending else [], unit)
    if RUNTIME in cri["runtimes"]:
        note = "; a config file is newer (restart pending)" if pending else ""
        return make(OK, f"PID {service['main_pid']}: runtimes {', '.join(cri['runtimes'])}{note}")
    summary = state["dump"]["summary"] if state["dump"] else None
    in_files = bool(summary and RUNTIME in summary["runtimes"])
    if cri["source"] == CTR and in_files:
        return _running_unlogged(make, service, pending, _newer_files(state) if pending else [], unit)
    if in_files and pending:
        newer = _newer_files(state)
        return make(
            BROKEN, f"PID {service['main_pid']}: no nvidia runtime; restart pending",
            cause=f"restart pending: {', '.join(newer) or 'a file under /etc/containerd'} changed after containerd "
            f"(PID {service['main_pid']}) started, so the running daemon has runtimes "
            f"{', '.join(cri['runtimes']) or 'none'} without nvidia",
            fix=f"restart it one node at a time: {RUNTIME_DEPLOY} (or `systemctl restart {unit}`)",
        )  # fmt: skip
    if in_files:
        return make(
            BROKEN, f"PID {service['main_pid']}: no nvidia runtime",
            cause=f"the merged config has nvidia but the running daemon (PID {service['main_pid']}) loaded only "
            f"{', '.join(cri['runtimes']) or 'none'}, and no config file is newer than it",
            fix=f"`systemctl restart {unit}`, then check the CRI plugin's start line in `journalctl -u {unit} -b`",
        )  # fmt: skip
    return make(
        BROKEN, f"PID {service['main_pid']}: no nvidia runtime",
        cause="neither the merged config nor the running daemon has the nvidia runtime",
        fix=f"register it: {RUNTIME_DEPLOY}",
    )  # fmt: skip


def _running_unlogged(
    make: Callable[..., Link], service: Mapping[str, Any], pending: bool, newer: list[str], unit: str
) -> Link:
    """The CRI plugin is up (``ctr plugins ls``) but containerd logs no start line at its log level, so which
    runtimes it loaded is not known: the merged config has nvidia; with no file newer than the daemon, the
    daemon started on that config."""
    pid = service["main_pid"]
    if not pending:
        return make(
            OK, f"PID {pid}: CRI plugin loaded; the merged config has nvidia and no file is newer than the daemon "
            "(its log level hides the runtimes it loaded)",
        )  # fmt: skip
    return make(
        BROKEN, f"PID {pid}: restart pending",
        cause=f"restart pending: {', '.join(newer) or 'a config file'} changed after containerd (PID {pid}) "
        "started, and at its log level it logs no CRI start line, so whether the running daemon has the nvidia "
        "runtime of the merged config is not known",
        fix=f"restart it one node at a time: {RUNTIME_DEPLOY} (or `systemctl restart {unit}`)",
    )  # fmt: skip


def _running_nri(
    make: Callable[..., Link],
    service: Mapping[str, Any],
    cri: Mapping[str, Any],
    pending: bool,
    newer: list[str],
    unit: str = "containerd",
) -> Link:
    """NRI mode: the running daemon's CRI plugin loaded, with CDI on where its start line says."""
    note = "; a config file is newer (restart pending)" if pending else ""
    if cri["enable_cdi"] is not False:
        return make(OK, f"PID {service['main_pid']}: CRI plugin loaded ({NRI_MODE}){note}")
    cause = f"the running containerd (PID {service['main_pid']}) loaded its CRI plugin with CDI off"
    if pending:
        return make(
            BROKEN, f"PID {service['main_pid']}: CDI off; restart pending",
            cause=f"{cause}: {', '.join(newer) or 'a file under /etc/containerd'} changed after it started",
            fix=f"restart it one node at a time: {RUNTIME_DEPLOY} (or `systemctl restart {unit}`)",
        )  # fmt: skip
    return make(
        BROKEN, f"PID {service['main_pid']}: CDI off",
        cause=f"{cause}, and no config file is newer than it",
        fix=f"`systemctl restart {unit}`, then check the CRI plugin's start line in `journalctl -u {unit} -b`",
    )  # fmt: skip


def _containerd_signals(facts: NodeReadinessInfo) -> Link:
    make = _link("containerd_restarts", "containerd not restarted by a signal or crash (last 24 h of this boot)")
    if facts["containerd"]["version"] is None:
        return make(NOT_APPLICABLE, "containerd not installed")
    journal = facts["containerd_journal"]
    _, unit = _unit(facts)
    if journal is None:
        return make(UNKNOWN, "no journal")
    signals, restarts = journal["signals"], journal["restarts"]
    if not signals and not restarts:
        return make(OK, "no signal or automatic restart")
    if signals:
        names = sorted({event["signal"] for event in signals})
        last = signals[-1]["time"]
        inferred = sum(bool(event.get("inferred")) for event in signals)
        unnamed = (
            f" ({inferred} of them sent with kill: the journal names no signal, but the daemon ended cleanly "
            "with no stop asked, as containerd does on SIGHUP)"
            if inferred
            else ""
        )
        return make(
            BROKEN, f"{len(signals)} signal(s) {', '.join(names)}, last {last}",
            cause=f"containerd was sent {', '.join(names)} {len(signals)} time(s) (first {signals[0]['time']}, "
            f"last {last}){unnamed} and restarted by systemd {len(restarts)} time(s): containerd has no reload, "
            "a signal ends it" + _operator_sighups(facts),
            fix="find what signals it (a config-management handler, `pkill -HUP`, logrotate) and make it "
            f"`systemctl restart {unit}` only after a config change, one node at a time",
        )  # fmt: skip
    return make(
        BROKEN, f"{len(restarts)} automatic restart(s), last {restarts[-1]}",
        cause=f"containerd exited on its own and systemd restarted it {len(restarts)} time(s), last {restarts[-1]}",
        fix=f"read `journalctl -u {unit} -b --until '{restarts[-1]}'` for why it exited",
    )  # fmt: skip


# ---- Kubernetes side --------------------------------------------------------------------------

VALIDATION_LINKS = {
    "driver-ready": "driver",
    "toolkit-ready": "toolkit",
    "cuda-ready": "CUDA workload",
    "plugin-ready": "device plugin",
}


def _validation(facts: NodeReadinessInfo, marker: str) -> Link:
    make = _link(f"validator:{marker}", f"GPU Operator validator: {marker}")
    validations = facts["validations"]
    if not facts["host"]["pci"]["gpus"]:
        return make(NOT_APPLICABLE, "no NVIDIA GPU")
    if validations is None:
        return make(NOT_APPLICABLE, f"the GPU Operator's validator has not run here (no {VALIDATIONS_DIR})")
    if marker in validations:
        return make(OK, f"{VALIDATIONS_DIR}/{marker}")
    return make(
        BROKEN, f"{VALIDATIONS_DIR}/{marker} missing",
        cause=f"the GPU Operator's validator has not passed its {VALIDATION_LINKS[marker]} check on this node "
        f"({VALIDATIONS_DIR} has {', '.join(sorted(validations)) or 'nothing'})",
        fix=f"read the nvidia-operator-validator pod's {marker.removesuffix('-ready')}-validation container log on "
        "this node (`kubectl -n gpu-operator logs <pod> -c "
        f"{marker.removesuffix('-ready')}-validation`)",
    )  # fmt: skip


def _device_plugin(facts: NodeReadinessInfo) -> Link:
    make = _link("device_plugin", "NVIDIA device plugin serving kubelet")
    if not facts["host"]["pci"]["gpus"]:
        return make(NOT_APPLICABLE, "no NVIDIA GPU")
    plugin = facts["device_plugin"]
    if plugin is None:
        return make(UNKNOWN, f"no {DEVICE_PLUGIN_DIR}: kubelet is not set up on this node")
    if plugin:
        return make(OK, ", ".join(f"{DEVICE_PLUGIN_DIR}/{name}" for name in plugin))
    return make(
        BROKEN, f"no nvidia-*.sock in {DEVICE_PLUGIN_DIR}",
        cause=f"no NVIDIA device plugin socket in {DEVICE_PLUGIN_DIR}, so kubelet reports nvidia.com/gpu: 0",
        fix="check the device plugin pod on this node (`kubectl get pods -A -o wide --field-selector "
        "spec.nodeName=NODE | grep device-plugin`) and its log; it needs every link above",
    )  # fmt: skip


def _gpu_only(link: Link, facts: NodeReadinessInfo) -> Link:
    """Links that only exist on GPU nodes are not applicable elsewhere."""
    if facts["host"]["pci"]["gpus"] or link.state == NOT_APPLICABLE:
        return link
    return Link(link.id, link.title, NOT_APPLICABLE, "no NVIDIA GPU")


def _versions(facts: NodeReadinessInfo) -> dict[str, str | None]:
    host, nvml, containerd = facts["host"], facts["nvml"], facts["containerd"]
    return {
        "kernel": host["kernel"],
        "module": host["driver"]["kernel_module_version"],
        "userspace": host["driver"]["userspace_version"],
        "nvml": nvml["nvml_version"] if nvml else None,
        "cuda": nvml["cuda_driver_version"] if nvml else None,
        "fabric_manager": host["fabric_manager"]["version"],
        "nvidia_ctk": facts["toolkit"]["ctk_version"],
        "containerd": containerd["version"]["raw"] if containerd["version"] else None,
    }


def assess(
    node: str,
    facts: NodeReadinessInfo,
    binary: str,
    spec_path: str,
    handler: str = RUNTIME_HANDLER,
    mode: str = CONTAINERD_MODE,
    today: date | None = None,
    persistence_mode: str = PERSISTENCE_MODE,
) -> NodeReadiness:
    """Every link of ``node``'s chain, in order, from the ``NodeReadiness`` fact; ``handler`` is the
    runtime name the cluster's RuntimeClass uses. In NRI mode (``mode`` ``nri``) no nvidia runtime is
    asked for: the merged config must have NRI and CDI on, and the handler is not applicable. ``today``
    (the controller's date) judges containerd's support window: a line past its end is a warning; so is
    persistence mode off where ``persistence_mode`` asks it on."""
    nri = mode == "nri"
    gpu = [
        _module(facts),
        _userspace(facts),
        _validation(facts, "driver-ready"),
        _xid(facts),
        _fabric_manager(facts),
        _toolkit(facts, binary, nri),
        _validation(facts, "toolkit-ready"),
        _cdi(facts, spec_path),
        _cdi_specs(facts),
    ]
    links = [
        _pci(facts),
        _gpu_only(_owners(facts, handler), facts),
        *(_gpu_only(link, facts) for link in gpu),
        _containerd_config(facts, nri),
        _containerd_running(facts, nri),
        _containerd_signals(facts),
        _runtime_writers(facts, handler),
        _runtime_handler(facts, handler, binary, nri),
        _validation(facts, "cuda-ready"),
        _validation(facts, "plugin-ready"),
        _device_plugin(facts),
    ]
    support = support_warning(facts["containerd"]["version"], today) if today else None
    warnings = [*([support] if support else []), *_lost_settings(facts), *_driver_skew(facts)]
    warnings += _persistence(facts, persistence_mode)
    return NodeReadiness(node, links, _versions(facts), warnings)


def _lost_settings(facts: NodeReadinessInfo) -> list[str]:
    """A warning where containerd's merged config has a setting other than its files write it (a file of
    another version, a later file owning the CRI plugin on 1.x), whoever wrote the files."""
    state = facts["containerd"]
    dump = state["dump"]
    if not state["version"] or not dump or dump["error"]:
        return []
    lost = lost_settings(dump["dump"], cast(list[ConfigFile], _load_order(state["files"])))
    return [f"containerd's merged config loses what its files set: {'; '.join(lost)}"] if lost else []


def _driver_skew(facts: NodeReadinessInfo) -> list[str]:
    """Warnings of a driver that works now but is out of step: the nvidia module will not load, or not match,
    once the node boots its next kernel; the userspace libraries are of two driver versions."""
    return [warning for _, warning in skew_warnings(facts["host"])]


def _persistence(facts: NodeReadinessInfo, mode: str) -> list[str]:
    """A warning where persistence mode is asked on (``mode``) and the node has it off."""
    host, nvml = facts["host"], facts.get("nvml")
    want = wanted(mode, [gpu["class"] for gpu in host["pci"]["gpus"]])
    devices = nvml["devices"] if nvml and not nvml["error"] else []
    problem = readiness_problem(want, host["driver"].get("persistenced"), devices)
    return [problem] if problem else []


def unjudged(node: str, error: str) -> NodeReadiness:
    """The report of a node whose answer could not be judged (``error``: what the controller raised on it):
    one broken link naming the error, so the node fails alone and every other node is reported."""
    cause = f"the controller could not judge this node's answer: {without_controls(error)[:500]}"
    link = Link("read", "the node's readiness read", BROKEN, "answer not judged", cause, "see the cause; report it")
    return NodeReadiness(node, [link])


# ---- output -----------------------------------------------------------------------------------


def node_text(report: NodeReadiness) -> str:
    """The node's chain as text: a headline, one line per link, then the first broken link's cause and fix
    (values read from the node, such as runtime names and paths, with their control characters shown)."""
    first = report.first_broken
    headline = "ready" if first is None else f"NOT READY at {first.id}"
    width = max(len(link.id) for link in report.links)
    lines = [f"{report.node}: {headline}"]
    lines += [f"  {link.state:<7} {link.id:<{width}}  {without_controls(link.detail)}" for link in report.links]
    lines += [f"  warning: {without_controls(warning)}" for warning in report.warnings]
    if first is not None:
        lines += [
            f"  cause: {without_controls(first.cause or first.detail)}",
            f"  fix:   {without_controls(first.fix or 'see the cause')}",
        ]
    return "\n".join(lines)


def fleet_summary(reports: list[NodeReadiness]) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for report in reports:
        if report.first_broken is not None:
            groups.setdefault(report.first_broken.id, []).append(report.node)
    return {
        "ready": sum(report.ready for report in reports),
        "total": len(reports),
        "not_ready_by_first_broken_link": groups,
    }


def fleet_text(reports: list[NodeReadiness]) -> str:
    summary = fleet_summary(reports)
    lines = [f"{summary['ready']} of {summary['total']} nodes ready"]
    lines += [f"  {link}: {', '.join(nodes)}" for link, nodes in summary["not_ready_by_first_broken_link"].items()]
    return "\n".join(lines)


# Version of ``fleet_json``'s layout: raised when a key changes meaning or goes away (added keys keep it).
# 2: the ``run`` the report is of, each node's ``read_at``, nodes the run did not read.
SCHEMA = 2
READY, NOT_READY, UNREADABLE = "ready", "not_ready", "unreadable"
NOT_READ = "not read: the run ended before this node's readiness was read"


@dataclass(frozen=True)
class RunInfo:
    """The run a report is of: a random ``id``, when it ``started`` and ``ended`` (ISO 8601, UTC), how many
    nodes it was for (its inventory, less what ``--limit`` left out), and whether every one of them was read
    or failed before the run ended (``complete``)."""

    id: str
    started: str
    ended: str
    inventory_nodes: int
    complete: bool


def _failure(report: NodeReadiness) -> dict[str, Any] | None:
    first = report.first_broken
    if first is None:
        return None
    return {"node": report.node, "state": NOT_READY, "link": first.id, "cause": first.cause, "fix": first.fix}


def fleet_json(
    reports: list[NodeReadiness], unreadable: Mapping[str, str] | None = None, run: RunInfo | None = None
) -> dict[str, Any]:
    """The whole report as JSON data: ``schema``, the ``run`` it is of, the ``summary`` of the nodes read,
    ``failures`` (one per node that is not ready or could not be read: ``unreadable`` maps such a node to why,
    a node the run did not reach included) and each node's detail with its ``state`` (``ready``,
    ``not_ready``, ``unreadable``) and the time it was read (``read_at``)."""
    unread = dict(unreadable or {})
    failures = [failure for report in reports if (failure := _failure(report))]
    failures += [
        {"node": node, "state": UNREADABLE, "link": None, "cause": why, "fix": None} for node, why in unread.items()
    ]
    nodes = [{**report.as_dict(), "state": READY if report.ready else NOT_READY} for report in reports]
    nodes += [{"node": node, "state": UNREADABLE, "ready": False, "error": why} for node, why in unread.items()]
    return {
        "schema": SCHEMA,
        "run": asdict(run) if run else None,
        "summary": fleet_summary(reports),
        "failures": failures,
        "nodes": nodes,
    }


def exit_status(document: Mapping[str, Any]) -> int:
    """0 when every node of ``fleet_json``'s ``document`` is ready, 2 when a node could not be read, else 1."""
    states = {failure["state"] for failure in document["failures"]}
    return 2 if UNREADABLE in states else 1 if states else 0
