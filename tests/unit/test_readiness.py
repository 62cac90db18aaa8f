"""The readiness chain from real fact outputs: the H200 (Ubuntu 24.04, open module 580.159.04,
preinstalled driver) as read, then one broken link at a time, each with its cause and fix."""

from __future__ import annotations

import copy
import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.containerd_files import resolve_tree
from pyinfra_gpunode.facts.containerd import ContainerdNodeState
from pyinfra_gpunode.facts.readiness import parse_containerd_journal, parse_xid
from pyinfra_gpunode.readiness import (
    BROKEN,
    NOT_APPLICABLE,
    OK,
    UNKNOWN,
    assess,
    fleet_json,
    fleet_text,
    node_text,
)
from pyinfra_gpunode.versions import parse_containerd_version
from tests.realbin.scenarios import CONFD, CONFIG, IMPORTS, registry, toolkit_dropin

TESTS = Path(__file__).resolve().parents[1]
BINARY = "/usr/bin/nvidia-container-runtime"
SPEC = "/etc/cdi/nvidia.yaml"


def fixture(name: str) -> Any:
    return copy.deepcopy(json.loads((TESTS / "facts" / f"{name}.json").read_text())["fact"])


def h200() -> dict[str, Any]:
    """The H200 exactly as read: no toolkit, no CDI spec, no containerd, no systemd."""
    return fixture("readiness.NodeReadiness/h200_ubuntu2404_preinstalled")


def converged_containerd() -> dict[str, Any]:
    lines = (TESTS / "samples/containerd-node-state-1.7-converged.txt").read_text().splitlines()
    return ContainerdNodeState().process(lines)


def healthy() -> dict[str, Any]:
    """The H200 with the toolkit, nvidia-ctk's real spec for it, containerd 1.7 converged and a device plugin."""
    facts = h200()
    facts["toolkit"] = fixture("toolkit.NvidiaContainerToolkit/installed_1_17")
    facts["cdi"] = fixture("cdi.CdiSpecs/ctk_sorted_yaml_h200")
    facts["containerd"] = converged_containerd()
    facts["cri"] = fixture("containerd.ContainerdCriLoaded/loaded_1_7")
    facts["xid"] = {"source": "journal", "count": 0, "lines": []}
    facts["containerd_journal"] = {"signals": [], "restarts": []}
    facts["device_plugin"] = ["nvidia-gpu.sock"]
    return facts


def states(facts: dict[str, Any]) -> dict[str, str]:
    return {link.id: link.state for link in assess("gpu1", facts, BINARY, SPEC).links}


def first_broken(facts: dict[str, Any]) -> tuple[str, str, str]:
    link = assess("gpu1", facts, BINARY, SPEC).first_broken
    assert link is not None and link.cause and link.fix, link
    return link.id, link.cause, link.fix


def test_h200_as_read_is_not_ready_at_the_toolkit() -> None:
    report = assess("h200", h200(), BINARY, SPEC)
    found = {link.id: (link.state, link.detail) for link in report.links}
    assert found["pci"] == (OK, "1 GPU: 0000:00:06.0 (0x2335)")
    assert found["module"] == (OK, "nvidia 580.159.04 (open) loaded")
    # The preinstalled library is a plain file without the version in its name: NVML's word counts.
    assert found["nvml"] == (OK, "module and library 580.159.04; NVML 13.580.159.04, CUDA 13.0, 1 GPU(s)")
    assert found["fabric_manager"][0] == NOT_APPLICABLE
    assert found["xid"][0] == UNKNOWN
    assert found["containerd_config"][0] == BROKEN and found["device_plugin"][0] == UNKNOWN
    assert not report.ready and report.first_broken is not None
    assert report.first_broken.id == "toolkit"
    assert report.first_broken.cause == (
        "the nvidia runtime binary /usr/bin/nvidia-container-runtime is missing and nvidia-ctk is not installed"
    )
    assert report.versions["module"] == "580.159.04" and report.versions["cuda"] == "13.0"


def test_h200_with_toolkit_spec_containerd_and_plugin_is_ready() -> None:
    report = assess("h200", healthy(), BINARY, SPEC)
    assert report.ready, node_text(report)
    found = {link.id: link for link in report.links}
    assert found["cdi"].detail == "/etc/cdi/nvidia.yaml: driver 580.159.04, 3 device names"
    assert found["containerd_running"].state == OK
    assert found["device_plugin"].detail == "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"
    assert {link.state for link in report.links} <= {OK, NOT_APPLICABLE}


def test_module_not_loaded_after_install() -> None:
    facts = healthy()
    facts["host"]["driver"] = fixture("driver.NvidiaDriver/userspace_only_not_loaded")
    facts["host"]["packages"] = {"nvidia-driver": {"version": "550.163.01-2", "held": True}}
    facts["host"]["module_built"] = True
    link, cause, fix = first_broken(facts)
    assert link == "module"
    assert "installed (userspace 550.163.01) but not loaded" in cause and "/sys/module/nvidia/version" in cause
    assert "modprobe nvidia" in fix


def test_module_not_built_for_the_running_kernel() -> None:
    facts = healthy()
    facts["host"]["driver"] = fixture("driver.NvidiaDriver/userspace_only_not_loaded")
    facts["host"]["packages"] = {"nvidia-driver": {"version": "550.163.01-2", "held": True}}
    facts["host"]["module_built"] = False
    link, cause, fix = first_broken(facts)
    assert link == "module" and "/lib/modules/6.18.44-fc-v657-gpu has no nvidia*.ko" in cause
    assert "dkms status" in fix


def test_module_loaded_at_another_version_than_the_library_is_a_pending_reboot() -> None:
    facts = healthy()
    facts["host"]["driver"] = fixture("driver.NvidiaDriver/mismatch")
    facts["nvml"] = fixture("nvml.NvmlInfo/mismatch")
    link, cause, fix = first_broken(facts)
    assert link == "nvml"
    assert cause.startswith("reboot pending after an upgrade: the loaded module is 510.73.05")
    assert "libnvidia-ml.so.515.48.07" in cause and "LibRmVersionMismatch" in cause
    assert "reboot" in fix and "gpunode_reboot" in fix


def test_nvml_failing_for_another_reason_names_the_error() -> None:
    facts = healthy()
    facts["nvml"] = fixture("nvml.NvmlInfo/library_not_found")
    link, cause, fix = first_broken(facts)
    assert link == "nvml" and cause == "the nvidia 580.159.04 module is loaded but NVML fails with LibraryNotFound"
    assert "ldconfig" in fix


@pytest.mark.parametrize(
    ("nvml_hung", "smi_hung", "named"),
    [(True, False, "NVML"), (False, True, "nvidia-smi"), (True, True, "NVML and nvidia-smi")],
)
def test_a_wedged_gpu_is_named_wedged_not_a_library_problem(nvml_hung: bool, smi_hung: bool, named: str) -> None:
    facts = healthy()
    if nvml_hung:
        facts["nvml"] = {**facts["nvml"], "error": "Timeout", "driver_version": None, "devices": []}
    facts["host"]["driver"]["nvidia_smi_hung"] = smi_hung
    link, cause, fix = first_broken(facts)
    assert link == "nvml" and cause.startswith(f"{named} did not answer in time (nvidia-smi 10 s, NVML 20 s)")
    assert "wedged" in cause and "reset the GPU" in fix


def test_nvml_seeing_fewer_gpus_than_the_pci_bus() -> None:
    facts = healthy()
    facts["host"]["pci"]["gpus"].append({"address": "0000:00:07.0", "class": "0x030200", "device": "0x2335"})
    link, cause, _ = first_broken(facts)
    assert link == "nvml" and "NVML lists 1 GPU(s) but the PCI bus has 2" in cause


def test_cdi_spec_missing() -> None:
    facts = healthy()
    facts["cdi"] = []
    link, cause, fix = first_broken(facts)
    assert link == "cdi" and "no CDI spec of kind nvidia.com/gpu in /etc/cdi or /var/run/cdi" in cause
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in fix


def test_cdi_spec_generated_for_another_driver() -> None:
    facts = healthy()
    facts["host"]["driver"] = fixture("driver.NvidiaDriver/open_565")
    facts["nvml"] = None
    link, cause, fix = first_broken(facts)
    assert link == "cdi"
    assert cause.startswith("/etc/cdi/nvidia.yaml was generated for driver 580.159.04 but 565.57.01 is loaded")
    assert fix.startswith("regenerate it for 565.57.01")


def test_cdi_spec_not_listing_a_gpu_the_node_has() -> None:
    facts = healthy()
    second = {"address": "0000:00:07.0", "class": "0x030200", "device": "0x2335"}
    facts["host"]["pci"]["gpus"].append(second)
    facts["nvml"]["devices"].append({**facts["nvml"]["devices"][0], "index": 1})
    link, cause, _ = first_broken(facts)
    assert link == "cdi" and "the node has 2 GPU(s): 1 missing" in cause


def test_cdi_spec_that_does_not_parse() -> None:
    facts = healthy()
    facts["cdi"] = fixture("cdi.CdiSpecs/ctk_generated_and_dgx")
    link, cause, _ = first_broken(facts)
    assert link == "cdi" and cause == "/etc/cdi/nvidia.yaml is not a CDI spec: 'devices' is not a list of named devices"


def test_fabric_manager_at_another_version_on_an_nvswitch_node() -> None:
    facts = healthy()
    facts["host"]["pci"] = fixture("gpus.NvidiaGpus/dgx_a100_nvswitch")
    facts["host"]["fabric_manager"] = fixture("fabric_manager.NvidiaFabricManager/cuda_repo_held")
    link, cause, fix = first_broken(facts)
    assert link == "fabric_manager"
    assert cause.startswith("Fabric Manager 595.71.05 does not match the loaded driver 580.159.04")
    assert "nvidia-fabricmanager 580.159.04" in fix


def test_fabric_manager_inactive_on_an_nvswitch_node() -> None:
    facts = healthy()
    facts["host"]["pci"] = fixture("gpus.NvidiaGpus/dgx_a100_nvswitch")
    fm = fixture("fabric_manager.NvidiaFabricManager/cuda_repo_held")
    fm.update(version="580.159.04-1", active="failed")
    facts["host"]["fabric_manager"] = fm
    link, cause, fix = first_broken(facts)
    assert link == "fabric_manager" and "nvidia-fabricmanager.service is failed (enabled: enabled)" in cause
    assert "systemctl enable --now nvidia-fabricmanager" in fix


XID_79 = (
    "2026-11-30T23:40:02.118340+00:00 gpu1 kernel: NVRM: Xid (PCI:0000:00:06.0): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus."
)
XID_13 = (
    "2026-11-30T23:41:00.000001+00:00 gpu1 kernel: NVRM: Xid (PCI:0000:00:06.0): 13, pid=4242, "
    "name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


def test_xid_lines_since_boot() -> None:
    facts = healthy()
    facts["xid"] = parse_xid(["source=journal", XID_13, XID_79, "count=2"])
    link, cause, fix = first_broken(facts)
    assert link == "xid" and cause.startswith("the kernel log (journal) has 2 Xid line(s) since boot, codes 13, 79; ")
    assert cause.endswith("GPU has fallen off the bus.")
    assert "79" in fix


def test_workload_xids_alone_do_not_break_the_chain() -> None:
    facts = healthy()
    facts["xid"] = parse_xid(["source=dmesg", XID_13, "count=1"])
    assert states(facts)["xid"] == OK


def test_validator_markers_join_the_chain_when_the_validator_has_run() -> None:
    facts = healthy()
    facts["validations"] = ["driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"]
    found = states(facts)
    assert [found[f"validator:{name}"] for name in ("driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready")] == [
        OK, OK, OK, OK,
    ]  # fmt: skip
    facts["validations"] = ["driver-ready"]
    link, cause, fix = first_broken(facts)
    assert link == "validator:toolkit-ready"
    assert "has not passed its toolkit check" in cause and "(/run/nvidia/validations has driver-ready)" in cause
    assert "-c toolkit-validation" in fix


def test_device_plugin_not_serving() -> None:
    facts = healthy()
    facts["device_plugin"] = []
    link, cause, _ = first_broken(facts)
    assert link == "device_plugin" and "kubelet reports nvidia.com/gpu: 0" in cause
    facts["device_plugin"] = None
    assert states(facts)["device_plugin"] == UNKNOWN


def _containerd(files: dict[str, str], runtimes: list[str], restart_pending: bool = False) -> dict[str, Any]:
    state = converged_containerd()
    state["files"] = {**resolve_tree(CONFIG, files), "texts": files, "mtimes": dict.fromkeys(files, 1764406100)}
    state["dump"]["summary"]["runtimes"] = {
        name: {"runtime_type": "io.containerd.runc.v2", "BinaryName": None, "SystemdCgroup": None} for name in runtimes
    }
    state["service"]["restart_pending"] = restart_pending
    state["service"]["started_at"] = 1764406000.482113
    return state


def test_nvidia_runtime_shadowed_by_a_later_drop_in_on_1_7_names_the_file() -> None:
    facts = healthy()
    files = {
        CONFIG: "version = 2\n" + IMPORTS,
        f"{CONFD}/99-nvidia.toml": toolkit_dropin(),
        f"{CONFD}/99-registry.toml": registry("/etc/containerd/certs.d"),
    }
    facts["containerd"] = _containerd(files, ["runc"])
    facts["cri"]["runtimes"] = ["runc"]
    link, cause, fix = first_broken(facts)
    assert link == "containerd_config"
    assert cause.startswith(
        "/etc/containerd/conf.d/99-nvidia.toml defines the nvidia runtime but /etc/containerd/conf.d/99-registry.toml,"
        " loaded after it, also sets the CRI plugin and containerd 1.7 keeps only the last file's CRI section"
    )
    assert "deploys/containerd_runtime.py" in fix


def test_nvidia_runtime_in_no_file() -> None:
    facts = healthy()
    facts["containerd"] = _containerd({CONFIG: "version = 2\n" + IMPORTS}, ["runc"])
    link, cause, _ = first_broken(facts)
    assert link == "containerd_config"
    assert cause == "no config file loaded from /etc/containerd/config.toml defines the nvidia runtime"


def test_nvidia_runtime_in_the_files_but_not_in_the_running_daemon_is_a_pending_restart() -> None:
    facts = healthy()
    files = {CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/99-nvidia.toml": toolkit_dropin()}
    facts["containerd"] = _containerd(files, ["nvidia", "runc"], restart_pending=True)
    facts["cri"]["runtimes"] = ["runc"]
    link, cause, fix = first_broken(facts)
    assert link == "containerd_running"
    assert cause.startswith("restart pending: /etc/containerd/config.toml, /etc/containerd/conf.d/99-nvidia.toml")
    assert "runtimes runc without nvidia" in cause and "systemctl restart containerd" in fix


@pytest.mark.parametrize("pending", [False, True])
def test_a_daemon_that_logs_no_cri_start_line_is_judged_by_the_merged_config(pending: bool) -> None:
    # containerd at log level warn: ctr says the CRI plugin is ok, and nothing says which runtimes it loaded.
    facts = healthy()
    files = {CONFIG: "version = 2\n" + IMPORTS, f"{CONFD}/99-nvidia.toml": toolkit_dropin()}
    facts["containerd"] = _containerd(files, ["nvidia", "runc"], restart_pending=pending)
    facts["cri"] = fixture("containerd.ContainerdCriLoaded/warn_level_ctr_ok_1_7")
    link = next(link for link in assess("gpu1", facts, BINARY, SPEC).links if link.id == "containerd_running")
    if not pending:
        assert link.state == OK, link
        assert "the merged config has nvidia and no file is newer than the daemon" in link.detail
        return
    assert link.state == BROKEN and link.cause and link.fix
    assert link.cause.startswith("restart pending: /etc/containerd/config.toml, /etc/containerd/conf.d/99-nvidia.toml")
    assert "is not known" in link.cause and "without nvidia" not in link.cause


def test_a_daemon_that_logs_no_cri_start_line_and_no_file_with_nvidia() -> None:
    facts = healthy()
    facts["containerd"] = _containerd({CONFIG: "version = 2\n" + IMPORTS}, ["runc"])
    facts["cri"] = fixture("containerd.ContainerdCriLoaded/warn_level_ctr_ok_1_7")
    link = next(link for link in assess("gpu1", facts, BINARY, SPEC).links if link.id == "containerd_running")
    assert (
        link.state == BROKEN and link.cause == "neither the merged config nor the running daemon has the nvidia runtime"
    )


def test_cri_plugin_failed_to_load_quotes_its_error_line() -> None:
    facts = healthy()
    facts["cri"] = fixture("containerd.ContainerdCriLoaded/failed_no_runc_1_7")
    link, cause, _ = first_broken(facts)
    assert link == "containerd_running"
    assert cause.endswith(
        "failed to load its CRI plugin: invalid plugin config: no corresponding runtime configured in "
        '`containerd.runtimes` for `containerd` `default_runtime_name = "runc"'
    )


# systemd 257 on a test host, `journalctl -o short-iso-precise` of `systemctl kill -s HUP containerd` twice.
SIGHUP_JOURNAL = [
    "journal",
    "2026-11-29T07:51:34.420445+00:00 node1 systemd[1]: containerd.service: Sent signal SIGHUP to main process 73 "
    "(containerd) on client request.",
    "2026-11-29T07:51:39.509197+00:00 node1 systemd[1]: containerd.service: Scheduled restart job, restart counter "
    "is at 1.",
    "2026-11-29T07:51:39.659026+00:00 node1 systemd[1]: containerd.service: Sent signal SIGHUP to main process 311 "
    "(containerd) on client request.",
    "2026-11-29T07:51:44.751002+00:00 node1 systemd[1]: containerd.service: Scheduled restart job, restart counter "
    "is at 2.",
]


def test_containerd_restarted_by_a_signal_says_when_and_how_often() -> None:
    facts = healthy()
    facts["containerd_journal"] = parse_containerd_journal(SIGHUP_JOURNAL)
    link, cause, fix = first_broken(facts)
    assert link == "containerd_restarts"
    assert cause.startswith(
        "containerd was sent SIGHUP 2 time(s) (first 2026-11-29T07:51:34.420445+00:00, "
        "last 2026-11-29T07:51:39.659026+00:00) and restarted by systemd 2 time(s)"
    )
    assert "systemctl restart containerd" in fix


def test_containerd_crash_restarts_without_a_signal() -> None:
    facts = healthy()
    facts["containerd_journal"] = parse_containerd_journal([SIGHUP_JOURNAL[0], SIGHUP_JOURNAL[2]])
    link, cause, _ = first_broken(facts)
    assert link == "containerd_restarts" and cause.startswith("containerd exited on its own and systemd restarted")


# systemd 257 and containerd 1.7.24 on a test host, the lines SIGNALS_SCRIPT selects: SIGHUP sent with
# kill(2) to the PID behind containerd's socket (as the GPU Operator's toolkit does), systemd's restart
# (Restart=always), then `systemctl restart containerd`.
KILL_HUP_JOURNAL = [
    "journal",
    "2026-12-01T20:47:42.928963+00:00 op1 systemd[1]: Starting containerd.service - containerd container runtime...",
    "2026-12-01T20:48:26.458421+00:00 op1 systemd[1]: containerd.service: Deactivated successfully.",
    "2026-12-01T20:48:31.482995+00:00 op1 systemd[1]: containerd.service: Scheduled restart job, restart counter "
    "is at 1.",
    "2026-12-01T20:48:31.501178+00:00 op1 systemd[1]: Starting containerd.service - containerd container runtime...",
    '2026-12-01T20:49:44.006308+00:00 op1 containerd[462]: time="2026-12-01T20:49:44.006216580Z" level=info '
    'msg="Stop CRI service"',
    "2026-12-01T20:49:44.009121+00:00 op1 systemd[1]: Stopping containerd.service - containerd container runtime...",
    '2026-12-01T20:49:44.024797+00:00 op1 containerd[462]: time="2026-12-01T20:49:44.021036362Z" level=info '
    'msg="Stop CRI service"',
    "2026-12-01T20:49:44.033277+00:00 op1 systemd[1]: containerd.service: Deactivated successfully.",
    "2026-12-01T20:49:44.046733+00:00 op1 systemd[1]: Starting containerd.service - containerd container runtime...",
]


def test_a_sighup_sent_with_kill_is_read_from_a_clean_end_nobody_asked_for() -> None:
    journal = parse_containerd_journal(KILL_HUP_JOURNAL)
    assert journal is not None
    assert journal == {
        "signals": [{"time": "2026-12-01T20:48:26.458421+00:00", "signal": "SIGHUP", "inferred": True}],
        "restarts": ["2026-12-01T20:48:31.482995+00:00"],
    }
    facts = healthy()
    facts["containerd_journal"] = journal
    link, cause, _ = first_broken(facts)
    assert link == "containerd_restarts"
    assert cause.startswith(
        "containerd was sent SIGHUP 1 time(s) (first 2026-12-01T20:48:26.458421+00:00, last "
        "2026-12-01T20:48:26.458421+00:00) (1 of them sent with kill: the journal names no signal, but the daemon "
        "ended cleanly with no stop asked, as containerd does on SIGHUP) and restarted by systemd 1 time(s)"
    )
    # Stops systemd or containerd itself logs, and an end before any start seen, are no signal.
    assert signals_in(KILL_HUP_JOURNAL[:1] + KILL_HUP_JOURNAL[2:3] + KILL_HUP_JOURNAL[4:]) == []
    shutdown = [line for line in KILL_HUP_JOURNAL if "Stopping" not in line]  # kill -TERM: containerd's own
    assert signals_in(shutdown) == journal["signals"]
    # A signal systemd names is counted once, not again at the end it causes.
    named = [*KILL_HUP_JOURNAL[:2], SIGHUP_JOURNAL[1], *KILL_HUP_JOURNAL[2:4]]
    assert signals_in(named) == [{"time": "2026-11-29T07:51:34.420445+00:00", "signal": "SIGHUP"}]


def signals_in(lines: list[str]) -> list[Any]:
    journal = parse_containerd_journal(lines)
    assert journal is not None
    return list(journal["signals"])


def test_no_journal_leaves_the_running_daemon_unknown() -> None:
    facts = healthy()
    facts["cri"] = None
    facts["containerd_journal"] = parse_containerd_journal([])
    found = states(facts)
    assert (found["containerd_running"], found["containerd_restarts"]) == (UNKNOWN, UNKNOWN)
    assert assess("gpu1", facts, BINARY, SPEC).ready


def test_node_without_gpu_has_only_containerd_links() -> None:
    facts = healthy()
    facts["host"]["pci"] = fixture("gpus.NvidiaGpus/no_gpu")
    facts["toolkit"] = fixture("toolkit.NvidiaContainerToolkit/absent")
    found = states(facts)
    gpu_links = [name for name in found if not name.startswith(("containerd", "runtime_"))]
    assert {found[name] for name in gpu_links} == {NOT_APPLICABLE}
    assert found["containerd_config"] == found["containerd_running"] == OK


def test_fleet_summary_groups_nodes_by_first_broken_link_and_json_matches_the_text() -> None:
    pending = healthy()
    pending["host"]["driver"] = fixture("driver.NvidiaDriver/mismatch")
    pending["nvml"] = fixture("nvml.NvmlInfo/mismatch")
    reports = [
        assess("gpu1", healthy(), BINARY, SPEC),
        assess("gpu2", h200(), BINARY, SPEC),
        assess("gpu3", pending, BINARY, SPEC),
        assess("gpu4", h200(), BINARY, SPEC),
    ]
    assert fleet_text(reports) == "1 of 4 nodes ready\n  toolkit: gpu2, gpu4\n  nvml: gpu3"
    document = json.loads(json.dumps(fleet_json(reports)))
    assert document["summary"] == {
        "ready": 1, "total": 4, "not_ready_by_first_broken_link": {"toolkit": ["gpu2", "gpu4"], "nvml": ["gpu3"]},
    }  # fmt: skip
    for report, node in zip(reports, document["nodes"], strict=True):
        table = node_text(report).splitlines()
        width = max(len(link["id"]) for link in node["links"])
        rows = [f"  {link['state']:<7} {link['id']:<{width}}  {link['detail']}" for link in node["links"]]
        assert rows == table[1 : 1 + len(rows)]
        if not node["ready"]:
            assert table[1 + len(rows) :] == [f"  cause: {node['cause']}", f"  fix:   {node['fix']}"]


@pytest.mark.parametrize("line", ["source=journal", "count=0"])
def test_xid_section_without_xid_lines(line: str) -> None:
    assert parse_xid([line, "count=0"])["count"] == 0


def test_gpu_without_driver_packages_is_told_apart_from_a_module_not_built() -> None:
    facts = h200()
    facts["host"]["driver"] = fixture("driver.NvidiaDriver/no_nvidia_software")
    facts["host"]["packages"] = {"linux-headers-6.18.44-fc-v657-gpu": {"version": "6.18.44-1", "held": False}}
    link, cause, fix = first_broken(facts)
    assert link == "module" and cause.startswith("no NVIDIA driver is installed") and "gpunode_driver_branch" in fix


def test_another_vendors_spec_is_not_taken_for_the_nvidia_spec() -> None:
    facts = healthy()
    broken_other = {**facts["cdi"][0], "path": "/etc/cdi/acme.yaml", "kind": None, "devices": [],
                    "error": "/etc/cdi/acme.yaml is not valid YAML or JSON: x"}  # fmt: skip
    facts["cdi"] = [broken_other, {**facts["cdi"][0], "path": "/var/run/cdi/nvidia.yaml"}]
    assert states(facts)["cdi"] == OK


def test_a_platform_unit_is_named_where_it_runs_containerd() -> None:
    """On a k3s node the report names k3s' unit, in the link and in the commands it gives."""
    facts = healthy()
    facts["containerd_unit"] = "k3s-agent.service"
    facts["containerd"]["service"].update(active_state="failed", sub_state="failed", result="exit-code")
    link = assess("gpu1", facts, BINARY, SPEC).first_broken
    assert link is not None and link.id == "containerd_running"
    assert link.detail == "k3s-agent.service failed (exit-code)"
    assert link.cause == "k3s-agent.service is failed/failed (result exit-code): kubelet has no container runtime"
    assert link.fix == (
        "read `journalctl -u k3s-agent.service -b -n 50`, fix the cause, then "
        "`systemctl reset-failed k3s-agent.service && systemctl start k3s-agent.service`"
    )
    facts = healthy()
    facts["containerd_unit"] = "k0sworker.service"
    facts["containerd_journal"] = parse_containerd_journal(SIGHUP_JOURNAL)
    link = assess("gpu1", facts, BINARY, SPEC).first_broken
    assert link is not None and link.id == "containerd_restarts" and link.fix
    assert "`systemctl restart k0sworker.service` only after a config change" in link.fix


def _handler_link(facts: dict[str, Any]) -> Any:
    return next(link for link in assess("gpu1", facts, BINARY, SPEC).links if link.id == "runtime_handler")


@pytest.mark.parametrize("platform", [None, "k3s", "rke2"])
def test_nvidia_on_another_cgroup_driver_than_the_default_runtime_is_broken(platform: str | None) -> None:
    # As k3s before k3s-io/k3s#8470 generated it: runc with SystemdCgroup = true, nvidia with BinaryName only.
    facts = healthy()
    runtimes = facts["containerd"]["dump"]["summary"]["runtimes"]
    runtimes["runc"]["SystemdCgroup"] = True
    facts["containerd"]["platform"]["name"] = platform
    link = _handler_link(facts)
    assert link.state == BROKEN, link
    assert link.detail == f"nvidia: {BINARY}; SystemdCgroup false, default runtime runc: SystemdCgroup true"
    assert "different cgroup drivers" in link.cause
    if platform:
        assert "k3s-io/k3s#8470" in link.fix and f"upgrade {'k3s' if platform == 'k3s' else 'RKE2'}" in link.fix
    else:
        assert link.fix.startswith("set host data gpunode_nvidia_systemd_cgroup to the default runtime's value")


def test_cgroup_drivers_compared_only_between_runc_runtimes_and_unset_is_false() -> None:
    facts = healthy()
    runtimes = facts["containerd"]["dump"]["summary"]["runtimes"]
    assert _handler_link(facts).state == OK  # nvidia false, runc unset: runc's default is false
    runtimes["runc"]["SystemdCgroup"] = True
    runtimes["runc"]["runtime_type"] = "io.containerd.kata.v2"  # another shim: its options mean other things
    assert _handler_link(facts).state == OK
    runtimes["runc"]["runtime_type"] = "io.containerd.runc.v2"
    runtimes["nvidia"]["SystemdCgroup"] = True
    assert _handler_link(facts).state == OK


def test_values_read_from_the_node_reach_the_report_text_without_control_characters() -> None:
    # A runtime name is a TOML key any file on the node may set: a newline or a terminal escape in it must
    # not forge report lines or act on the operator's terminal.
    facts = healthy()
    runtimes = facts["containerd"]["dump"]["summary"]["runtimes"]
    runtimes["runc\x1b[2J\nok      forged"] = runtimes.pop("runc")
    facts["containerd"]["dump"]["summary"]["default_runtime_name"] = "runc\x1b[2J\nok      forged"
    text = node_text(assess("gpu1", facts, BINARY, SPEC))
    assert "\x1b" not in text and "\nok      forged" not in text
    assert "runc<U+001B>[2J<U+000A>ok      forged" in text


def test_the_readiness_report_warns_and_stays_ready() -> None:
    facts = healthy()
    facts["containerd"]["version"] = parse_containerd_version("containerd github.com/containerd/containerd 1.7.24 x")
    report = assess("gpu1", facts, BINARY, SPEC, today=date(2026, 12, 7))
    assert report.ready
    (warning,) = report.warnings
    assert "1.7 line is past its end of support since 2026-09-30" in warning
    assert f"  warning: {warning}" in node_text(report).splitlines()
    assert fleet_json([report])["nodes"][0]["warnings"] == [warning]
    assert assess("gpu1", facts, BINARY, SPEC).warnings == []  # no date given: no judgement
    facts["containerd"]["version"] = parse_containerd_version("containerd github.com/containerd/containerd/v2 v2.3.4 x")
    assert assess("gpu1", facts, BINARY, SPEC, today=date(2026, 12, 7)).warnings == []
