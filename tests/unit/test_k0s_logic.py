"""k0s nodes: which layouts gpunode writes a drop-in on, the drop-in's schema as k0s checks it, and the
plan, from the managed config k0s 1.36 writes (tests/samples/k0s-containerd-1.36.toml)."""

from __future__ import annotations

import base64
from pathlib import Path

from pyinfra_gpunode import k0s
from pyinfra_gpunode.containerd_dropin import Options, plan
from pyinfra_gpunode.facts.k0s import K0sContainerd
from pyinfra_gpunode.platform import K0S_CONFIG

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "k0s-containerd-1.36.toml"
MANAGED = SAMPLE.read_text().split("\n", 1)[1]  # the file as k0s writes it: its first line is the source
V2 = {"major": 2, "minor": 1, "patch": 9, "raw": "2.1.9~ds1"}
V1 = {"major": 1, "minor": 7, "patch": 34, "raw": "1.7.34"}
# k0s 1.35 (v1.35.7+k0s.0, component.go setupConfig): version 2, importing the CRI config k0s generates.
MANAGED_1_35 = (
    "# k0s_managed=true\n# This is a placeholder configuration for k0s managed containerd.\n"
    'imports = ["/run/k0s/containerd-cri.toml"]\nversion = 2\n'
)
RUNC = {"runtime_type": "io.containerd.runc.v2", "options": {}}


def test_the_managed_file_of_k0s_1_36_takes_our_drop_in() -> None:
    assert MANAGED.startswith("# k0s_managed=true\n")
    assert k0s.layout_problem(V2, {K0S_CONFIG: MANAGED}) is None


def test_other_layouts_are_refused_naming_why_and_what_to_do() -> None:
    taken_over = k0s.layout_problem(V2, {K0S_CONFIG: MANAGED.replace("# k0s_managed=true\n", "")}) or ""
    assert "is not k0s-managed" in taken_over and "yourself" in taken_over
    old = k0s.layout_problem(V1, {K0S_CONFIG: MANAGED_1_35}) or ""
    assert "k0s 1.35 or earlier" in old and "/run/k0s/containerd-cri.toml" in old and "io.containerd.grpc.v1.cri" in old
    other_imports = MANAGED.replace('imports = ["/etc/k0s/containerd.d/*.toml"]', 'imports = ["/etc/other/*.toml"]')
    assert "does not import /etc/k0s/containerd.d/*.toml" in (k0s.layout_problem(V2, {K0S_CONFIG: other_imports}) or "")
    assert "is missing" in (k0s.layout_problem(V2, {}) or "")
    assert "binary was not found" in (k0s.layout_problem(None, {K0S_CONFIG: MANAGED}) or "")
    refused = k0s.refusal(["k0s: unit k0sworker.service"], old)
    assert refused.startswith("k0s owns containerd here (socket /run/k0s/containerd.sock")
    assert refused.endswith("nothing was changed on this node (found: k0s: unit k0sworker.service)")


def test_drop_ins_k0s_would_refuse_are_named() -> None:
    assert k0s.dropin_problems("version = 3\n") == []
    assert k0s.dropin_problems('[plugins."io.containerd.cri.v1.runtime"]\nenable_cdi = true\n') == []
    assert k0s.dropin_problems("version = 2\n") == [
        f"{k0s.DROPIN}: version = 2; k0s takes drop-ins of version 3 or none"
    ]
    assert k0s.dropin_problems('version = 3\n[plugins."io.containerd.grpc.v1.cri".containerd]\n') == [
        f"{k0s.DROPIN}: names io.containerd.grpc.v1.cri, which k0s refuses in drop-ins"
    ]


def test_the_planned_drop_in_is_version_3_in_the_runtime_plugin_copied_from_the_default() -> None:
    texts = {
        K0S_CONFIG: MANAGED,
        # a user's drop-in as docs/runtime.md shows one, and a runc of their own with the systemd cgroup driver
        f"{k0s.ROOT}/containerd.d/cri-registry.toml": 'version = 3\n[plugins."io.containerd.cri.v1.images".registry]\n'
        'config_path = "/etc/k0s/containerd.d/certs.d"\n',
        f"{k0s.ROOT}/containerd.d/runc.toml": (
            '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\nSystemdCgroup = true\n'
        ),
    }
    result = plan(K0S_CONFIG, texts, V2, k0s.options(Options()), RUNC)
    assert result.errors == [] and result.dropin_path == k0s.DROPIN
    assert k0s.dropin_problems(result.dropin_text) == []
    assert "version = 3\n" in result.dropin_text
    assert '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]' in result.dropin_text
    assert "SystemdCgroup = true" in result.dropin_text  # as the default runtime runc has it
    assert "Imported through /etc/k0s/containerd.d/*.toml" in result.dropin_text
    assert "io.containerd.grpc.v1.cri" not in result.dropin_text


def test_the_plan_says_the_write_is_k0s_restart_and_the_kubelet_keeps_running() -> None:
    line = k0s.write_line("k0sworker.service")
    assert line.startswith(f"write {k0s.DROPIN}: k0s restarts its containerd about 3 s later")
    assert "the kubelet keeps running" in line and "/run/k0s/containerd.sock" in line


def test_the_k0s_fact_reads_its_files_and_processes_only() -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    dropin = "version = 3\n"
    output = [
        "@@version",
        "containerd github.com/containerd/containerd/v2 2.1.9~ds1 2.1.9~ds1-1",
        "@@files",
        f"644 {b64(K0S_CONFIG)} {b64(MANAGED)}",
        f"600 {b64(k0s.DROPIN)} {b64(dropin)}",
        f"644 {b64('/etc/passwd')} {b64('root:x:0:0')}",  # not a k0s config path: left out
        "@@processes",
        "812 k0sworker.service",
        "77 containerd.service",
        "x y",
    ]
    found = K0sContainerd().process(output)
    assert found["version"] and found["version"]["major"] == 2
    assert found["texts"] == {K0S_CONFIG: MANAGED, k0s.DROPIN: dropin}
    assert found["modes"] == {K0S_CONFIG: "644", k0s.DROPIN: "600"}
    assert found["processes"] == {812: "k0sworker.service", 77: "containerd.service"}
    assert found["dump"] is None
