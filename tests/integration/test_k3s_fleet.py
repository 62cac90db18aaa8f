"""k3s and RKE2 agent nodes on real systemd hosts: a k3s agent on Debian trixie's containerd 1.7.24 with
the version-2 template, and an RKE2 agent on Debian sid's containerd 2.1.9 with the version-3 template,
each run as the agent runs it, under the agent's unit name, on its generated config and socket. gpunode
writes nothing there: without the NVIDIA Container Toolkit's runtime the node is refused; with it, the
agent adds the nvidia runtime itself at its start, so the rollout restarts its unit in the node's turn and
verifies it; a re-run changes nothing.

What is real: the containerd binary, its CRI plugin and start line, systemd, and the configs the agents
generate (``tests/samples/k3s-containerd-config.toml`` and ``rke2-containerd-config-v3.toml``, source on
their first line, which is not planted). What is a STAND-IN, since the k3s and RKE2 binaries are not
available here:

- the agent's unit (``k3s-agent.service``, ``rke2-agent.service``) runs containerd itself (the agent runs
  it as a child, next to the kubelet) with the arguments the agent passes
  (``pkg/agent/containerd/config_linux.go``: ``-c``, ``-a``, ``--state``, ``--root``); its root is under
  /var/lib/containerd (the host's bind mount, so its overlayfs snapshotter does not stack on the overlay
  root; the agents use /var/lib/rancher/<program>/agent/containerd);
- its ``ExecStartPre`` stands in for what the agent does at every start: it writes
  /var/lib/rancher/<program>/agent/etc/containerd/config.toml afresh from the rendered template and adds
  the runtimes ``pkg/agent/containerd/runtimes.go`` (``findNvidiaContainerRuntimes``) finds: ``nvidia`` and
  ``nvidia-experimental`` (``io.containerd.runc.v2``, ``BinaryName`` the path found) for
  ``nvidia-container-runtime`` and ``nvidia-container-runtime-experimental`` in /usr/local/nvidia/toolkit,
  else /usr/bin, rendered as the template's ``ExtraRuntimes`` blocks in the template's plugin name and quotes,
  with runc's ``SystemdCgroup`` (k3s-io/k3s#8470; without it where the test plants ``before-8470``, as
  releases before October 2023 render them), and no ``config.toml.tmpl`` handling;
- containerd's output goes to /var/lib/rancher/<program>/agent/containerd/containerd.log, as the agent sends it
  (``pkg/agent/containerd``: ``Containerd.Log``), so its unit's journal has no CRI start line;
- /usr/bin/nvidia-container-runtime, where planted, is a script that runs runc (the toolkit is not
  installed: nothing runs containers on these hosts);
- a second ``ExecStartPre`` refuses to start containerd while a file in RKE2's config-v3.toml.d sets
  ``SystemdCgroup = false``: a stand-in for a containerd that does not come up with a drop-in, to see the
  rollback.

On the RKE2 layout (containerd 2.x, the generated config imports config-v3.toml.d) host data the agent does
not apply (nvidia as the default runtime, CDI off) goes into gpunode's drop-in there, written in the node's
turn with a restart of the agent's unit; on the k3s layout (containerd 1.7, version 2) it stays refused.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dump import parse_cri_start_log
from tests import cli
from tests.fleet.fleet import Fleet, HostSpec
from tests.fleet.plugin import FleetFactory

REPO = Path(__file__).resolve().parents[2]
SOCKET = "/run/k3s/containerd/containerd.sock"
STAND_IN = "/usr/local/lib/rancher-stand-in"
DROPINS = "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d"
DROPIN = f"{DROPINS}/90-gpunode-nvidia.toml"
TOOLKIT = "/usr/bin/nvidia-container-runtime"
pytestmark = pytest.mark.fleet


@dataclass(frozen=True)
class Layout:
    """One agent as a node runs it: its program, unit, host and the config its template renders."""

    program: str  # "k3s" or "rke2"
    label: str  # as gpunode names the platform
    node: str
    suite: str  # Debian suite of the host: which containerd it runs
    unit: str
    sample: str  # tests/samples/<sample>: the rendered template (its first line names its source)
    cri_plugin: str  # the CRI runtime plugin of the template's version, as it renders ExtraRuntimes
    template: str  # the template the generated file's first line points to
    quote: str  # the quotes the template puts around plugin and runtime names

    @property
    def config(self) -> str:
        return f"/var/lib/rancher/{self.program}/agent/etc/containerd/config.toml"

    @property
    def log(self) -> str:  # the agents' containerd logs here, not to the journal
        return f"/var/lib/rancher/{self.program}/agent/containerd/containerd.log"


LAYOUTS = [
    # containerd 1.7.24, which k3s releases with the version-2 template ship
    Layout("k3s", "k3s", "k3s1", "trixie", "k3s-agent.service", "k3s-containerd-config.toml",
           "io.containerd.grpc.v1.cri", "config.toml.tmpl", '"'),
    # containerd 2.1.9, as RKE2 releases with the version-3 template ship 2.x
    Layout("rke2", "RKE2", "rke2n1", "sid", "rke2-agent.service", "rke2-containerd-config-v3.toml",
           "io.containerd.cri.v1.runtime", "config-v3.toml.tmpl", "'"),
]  # fmt: skip
BY_ID = {layout.program: layout for layout in LAYOUTS}


def agent_unit(layout: Layout) -> str:
    return f"""\
[Unit]
Description=Stand-in for the {layout.label} agent: containerd as the agent runs it (test)
[Service]
Type=notify
ExecStartPre={STAND_IN}/generate-config
ExecStartPre=/bin/sh -c '! grep -qs "SystemdCgroup = false" {DROPINS}/*.toml'
ExecStart=/usr/bin/containerd -c {layout.config} -a {SOCKET} --state /run/k3s/containerd \\
    --root /var/lib/containerd/{layout.program}
StandardOutput=append:{layout.log}
StandardError=append:{layout.log}
Restart=always
RestartSec=5s
KillMode=process
Delegate=yes
[Install]
WantedBy=multi-user.target
"""


def generate_config(layout: Layout) -> str:
    """The agent's own start: the template rendered afresh, with the nvidia runtimes it finds (see the
    module's docstring)."""
    config = layout.config
    return f"""\
#!/bin/sh
set -e
mkdir -p {config.rsplit("/", 1)[0]}
{{
    cat {STAND_IN}/config.toml.rendered
    q={shlex.quote(layout.quote)}
    for pair in nvidia:nvidia-container-runtime nvidia-experimental:nvidia-container-runtime-experimental; do
        name=${{pair%%:*}}
        binary=${{pair#*:}}
        for location in /usr/local/nvidia/toolkit /usr/bin; do
            if [ -e "$location/$binary" ] && [ ! -d "$location/$binary" ]; then
                table="plugins.${{q}}{layout.cri_plugin}${{q}}.containerd.runtimes.${{q}}${{name}}${{q}}"
                printf '\\n[%s]\\n  runtime_type = "io.containerd.runc.v2"\\n' "$table"
                printf '[%s.options]\\n  BinaryName = "%s"\\n' "$table" "$location/$binary"
                if [ ! -e {STAND_IN}/before-8470 ]; then printf '  SystemdCgroup = true\\n'; fi
                break
            fi
        done
    done
    echo
}} > {config}.partial
mv -f {config}.partial {config}
"""


TOOLKIT_STAND_IN = '#!/bin/sh\nexec runc "$@"\n'


@pytest.fixture(scope="module")
def fleet(fleet_factory: FleetFactory) -> Iterator[Fleet]:
    with fleet_factory.lent([HostSpec(layout.node, layout.suite) for layout in LAYOUTS], "rancher") as booted:
        yield booted


@pytest.fixture(params=[layout.program for layout in LAYOUTS])
def layout(request: pytest.FixtureRequest) -> Layout:
    return BY_ID[request.param]


def sh(fleet: Fleet, layout: Layout, command: str) -> str:
    result = fleet.run(layout.node, command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def put(fleet: Fleet, layout: Layout, path: str, text: str, mode: str = "644") -> None:
    sh(fleet, layout, f"mkdir -p $(dirname {path}) && printf %s {shlex.quote(text)} > {path} && chmod {mode} {path}")


def agent_pid(fleet: Fleet, layout: Layout) -> str:
    return sh(fleet, layout, f"systemctl show -p MainPID --value {layout.unit}").strip()


def cri_up(fleet: Fleet, layout: Layout, other_than: str = "", seconds: float = 60) -> str:
    """The PID of the unit's containerd once it is not ``other_than`` and ctr lists its CRI plugin ``ok``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = agent_pid(fleet, layout)
        plugins = fleet.run(layout.node, f"ctr --address {SOCKET} plugins ls").stdout
        if pid not in ("", "0", other_than) and any(
            line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
            for line in plugins.splitlines()
        ):
            return pid
        time.sleep(0.5)
    status = fleet.run(layout.node, f"systemctl status {layout.unit}; tail -n 20 {layout.log}").stdout
    raise AssertionError(f"{layout.label}'s containerd not up: {status}")


def agent_node(fleet: Fleet, layout: Layout) -> str:
    """A fresh host laid out as the agent's node without the toolkit; the PID of its containerd."""
    fleet.reset([layout.node])
    rendered = (REPO / "tests" / "samples" / layout.sample).read_text().split("\n", 1)[1]
    put(fleet, layout, f"{STAND_IN}/config.toml.rendered", rendered)
    put(fleet, layout, f"{STAND_IN}/generate-config", generate_config(layout), mode="755")
    put(fleet, layout, f"/etc/systemd/system/{layout.unit}", agent_unit(layout))
    sh(
        fleet, layout,
        "systemctl disable --now containerd.service && systemctl mask containerd.service && "
        f"mkdir -p {layout.log.rsplit('/', 1)[0]} && systemctl daemon-reload && systemctl enable --now {layout.unit}",
    )  # fmt: skip
    return cri_up(fleet, layout)


def deploy(fleet: Fleet, layout: Layout, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.pyinfra(*args, "--limit", layout.node, fleet.inventory_path, "deploys/containerd_runtime.py")


def readiness(fleet: Fleet, layout: Layout, report: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """deploys/readiness.py on the node: its process and each link's state and detail, by id."""
    result = cli.pyinfra(
        "-y", "--limit", layout.node, "--data", f"gpunode_readiness_json={report}", fleet.inventory_path,
        "deploys/readiness.py", timeout=300,
    )  # fmt: skip
    (node,) = json.loads(report.read_text())["nodes"]
    return result, {link["id"]: f"{link['state']}: {link['detail']}" for link in node["links"]}


def loaded_runtimes(fleet: Fleet, layout: Layout) -> list[str]:
    """The runtimes the CRI plugin of the last containerd started with (its start line in the agent's
    containerd log: "Start cri plugin with config" on 1.x, "starting cri plugin" on 2.x)."""
    line = sh(fleet, layout, f"grep -E 'Start cri plugin with config|starting cri plugin' {layout.log} | tail -n 1")
    loaded = parse_cri_start_log(line.splitlines())
    assert loaded["loaded"], sh(fleet, layout, f"tail -n 20 {layout.log}")
    return sorted(loaded["runtimes"])


def node_files(fleet: Fleet, layout: Layout) -> str:
    """What gpunode could have written: the agent's containerd directory, /etc/containerd and gpunode's state."""
    return sh(
        fleet, layout,
        f"find /var/lib/rancher/{layout.program}/agent/etc /etc/containerd /var/lib/pyinfra-gpunode -type f "
        "2>/dev/null | sort | xargs -r sha256sum",
    )  # fmt: skip


def test_the_agent_adds_nvidia_at_the_unit_restart_in_the_turn(fleet: Fleet, layout: Layout, tmp_path: Path) -> None:
    pid = agent_node(fleet, layout)
    unit, config, label = layout.unit, layout.config, layout.label
    assert sh(fleet, layout, f"grep -m 1 -v '^$' {config}").strip() == (
        f"# File generated by {layout.program}. DO NOT EDIT. Use {layout.template} instead."
    )
    assert loaded_runtimes(fleet, layout) == ["runc"]
    before = node_files(fleet, layout)

    # No toolkit: the agent would not add nvidia, and gpunode does not edit what the agent generates.
    refused = deploy(fleet, layout, "-y")
    assert refused.returncode != 0, refused.stdout
    units = ", ".join(
        f"{layout.program}{suffix}.service"
        for suffix in {"k3s": ("", "-agent"), "rke2": ("-server", "-agent")}[layout.program]
    )
    assert f"{label} owns containerd here: it runs containerd inside its unit ({units}) on {SOCKET}" in (
        refused.stdout
    ), refused.stdout
    assert "neither is there (install the NVIDIA Container Toolkit" in refused.stdout
    assert node_files(fleet, layout) == before
    assert agent_pid(fleet, layout) == pid

    put(fleet, layout, TOOLKIT, TOOLKIT_STAND_IN, mode="755")
    plan = deploy(fleet, layout, "--dry")
    assert plan.returncode == 0, plan.stdout
    assert (
        f"plan: {unit} must be restarted, the kubelet with it: {label} adds the nvidia runtime itself at its "
        f"start, and it finds {TOOLKIT}, but {config} has no nvidia runtime yet; restart it and verify"
    ) in plan.stdout, plan.stdout
    assert node_files(fleet, layout) == before
    assert agent_pid(fleet, layout) == pid

    rolled = deploy(fleet, layout, "-y")
    assert rolled.returncode == 0, rolled.stdout
    assert "done: containerd restarted and verified" in rolled.stdout, rolled.stdout
    restarted = cri_up(fleet, layout)
    assert restarted != pid
    assert loaded_runtimes(fleet, layout) == ["nvidia", "runc"]
    generated = sh(fleet, layout, f"cat {config}")
    q = layout.quote
    assert f'runtimes.{q}nvidia{q}.options]\n  BinaryName = "{TOOLKIT}"\n  SystemdCgroup = true' in generated, generated
    assert not sh(fleet, layout, "ls /etc/containerd/conf.d /etc/containerd/gpunode 2>/dev/null || true").strip()

    again = deploy(fleet, layout, "-y")
    assert again.returncode == 0, again.stdout
    assert f"{label} adds the nvidia runtime itself: found in {config}" in again.stdout, again.stdout
    assert agent_pid(fleet, layout) == restarted
    assert sh(fleet, layout, f"cat {config}") == generated

    # Host data the agent would not apply: on containerd 1.7 (no safe drop-in) refused before anything changes,
    # naming the key and the agent's way; RKE2's 2.x layout takes a drop-in (the next test).
    if layout.program == "rke2":
        return
    written = node_files(fleet, layout)
    asked = deploy(fleet, layout, "-y", "--data", "gpunode_nvidia_default_runtime=true")
    assert asked.returncode != 0, asked.stdout
    assert (
        f"{label} owns containerd here and adds the nvidia runtime itself, so gpunode writes no containerd config "
        "on this node and cannot apply: gpunode_nvidia_default_runtime: True (set `default-runtime: nvidia` in "
        f"/etc/rancher/{layout.program}/config.yaml); then restart {unit}"
    ) in asked.stdout, asked.stdout
    assert agent_pid(fleet, layout) == restarted
    assert node_files(fleet, layout) == written

    # The report reads the agent's containerd (its unit, generated config and socket), not containerd.service's.
    version = sh(fleet, layout, "containerd --version").split()[2]
    report, links = readiness(fleet, layout, tmp_path / "readiness.json")
    assert report.returncode == 0, report.stdout
    assert "1 of 1 nodes ready" in report.stdout, report.stdout
    assert links["containerd_config"] == f"ok: containerd {version}: nvidia ({TOOLKIT}), default runc", links
    assert links["containerd_running"] == f"ok: PID {restarted}: runtimes nvidia, runc", links
    assert links["containerd_restarts"].startswith("ok: "), links
    assert links["runtime_handler"] == f"ok: nvidia: {TOOLKIT}", links
    assert links["runtime_writers"] == f"ok: {config} ({label}, BinaryName {TOOLKIT})", links
    assert agent_pid(fleet, layout) == restarted

    # An agent release before k3s-io/k3s#8470 gives nvidia no SystemdCgroup: its pods run on another cgroup
    # driver than the kubelet's, and the report says so, with the upgrade as the fix.
    put(fleet, layout, f"{STAND_IN}/before-8470", "")
    sh(fleet, layout, f"systemctl restart {unit}")
    old_release = cri_up(fleet, layout, other_than=restarted)
    report, links = readiness(fleet, layout, tmp_path / "old-release.json")
    assert report.returncode != 0, report.stdout
    assert links["runtime_handler"] == (
        f"broken: nvidia: {TOOLKIT}; SystemdCgroup false, default runtime runc: SystemdCgroup true"
    ), links
    assert f"upgrade {label} (its unit restarts" in report.stdout, report.stdout
    assert agent_pid(fleet, layout) == old_release


def test_rke2_on_containerd_2_takes_host_data_by_a_drop_in_in_the_turn(fleet: Fleet, tmp_path: Path) -> None:
    layout = BY_ID["rke2"]
    unit = layout.unit
    first = agent_node(fleet, layout)
    put(fleet, layout, TOOLKIT, TOOLKIT_STAND_IN, mode="755")
    sh(fleet, layout, f"systemctl restart {unit}")
    pid = cri_up(fleet, layout, other_than=first)
    assert loaded_runtimes(fleet, layout) == ["nvidia", "runc"]
    before = node_files(fleet, layout)
    data = ("--data", "gpunode_nvidia_default_runtime=true", "--data", "gpunode_enable_cdi=false")

    plan = deploy(fleet, layout, "--dry", *data)
    assert plan.returncode == 0, plan.stdout
    assert f"plan: write {DROPIN} (io.containerd.cri.v1.runtime.containerd.default_runtime_name = 'nvidia', " in (
        plan.stdout
    ), plan.stdout
    assert f"then restart {unit} (the kubelet restarts with it) and verify on its socket" in plan.stdout
    assert '+default_runtime_name = "nvidia"' in plan.stdout and "+enable_cdi = false" in plan.stdout
    assert node_files(fleet, layout) == before
    assert agent_pid(fleet, layout) == pid

    rolled = deploy(fleet, layout, "-y", *data)
    assert rolled.returncode == 0, rolled.stdout
    assert "done: containerd written" in rolled.stdout, rolled.stdout
    assert "RKE2 restarted its containerd (pid" in rolled.stdout, rolled.stdout
    written = cri_up(fleet, layout, other_than=pid)
    dropin = sh(fleet, layout, f"cat {DROPIN}")
    assert "version = 3\n" in dropin and "io.containerd.grpc.v1.cri" not in dropin, dropin
    line = sh(fleet, layout, f"grep -E 'starting cri plugin' {layout.log} | tail -n 1")
    loaded = parse_cri_start_log(line.splitlines())
    assert loaded["default_runtime_name"] == "nvidia" and loaded["enable_cdi"] is False, line
    assert sorted(loaded["runtimes"]) == ["nvidia", "runc"]
    assert sh(fleet, layout, "ls /var/lib/pyinfra-gpunode/backup").startswith("rancher-containerd-")
    report, links = readiness(fleet, layout, tmp_path / "readiness.json")
    assert report.returncode == 0, report.stdout
    assert "1 of 1 nodes ready" in report.stdout, report.stdout
    assert links["containerd_running"] == f"ok: PID {written}: runtimes nvidia, runc", links

    again = deploy(fleet, layout, "-y", *data)
    assert again.returncode == 0, again.stdout
    assert f"{DROPIN} sets io.containerd.cri.v1.runtime.containerd.default_runtime_name = 'nvidia'" in again.stdout
    assert agent_pid(fleet, layout) == written
    assert sh(fleet, layout, f"cat {DROPIN}") == dropin

    # A drop-in containerd does not come up with (the stand-in refuses SystemdCgroup = false): put back, failed.
    kept = sh(fleet, layout, f"sha256sum {DROPINS}/*; stat -c '%a %U %G' {DROPINS} {DROPIN}")
    failed = deploy(
        fleet,
        layout,
        "-y",
        *data,
        "--data",
        "gpunode_nvidia_systemd_cgroup=false",
        "--data",
        "gpunode_restart_timeout=8",
    )
    assert failed.returncode != 0, failed.stdout
    assert f"RKE2's containerd failed after the write of {DROPIN}: RKE2 did not start a new containerd" in (
        failed.stdout
    ), failed.stdout
    assert "was put back as the backup taken before the write holds it, and RKE2's containerd runs it again" in (
        failed.stdout
    ), failed.stdout
    assert sh(fleet, layout, f"sha256sum {DROPINS}/*; stat -c '%a %U %G' {DROPINS} {DROPIN}") == kept
    back = cri_up(fleet, layout, other_than=written)
    line = sh(fleet, layout, f"grep -E 'starting cri plugin' {layout.log} | tail -n 1")
    assert parse_cri_start_log(line.splitlines())["default_runtime_name"] == "nvidia", line
    assert agent_pid(fleet, layout) == back

    # Host data that stops asking: the drop-in is emptied in the turn, and the agent's own config stands again.
    emptied = deploy(fleet, layout, "-y")
    assert emptied.returncode == 0, emptied.stdout
    assert f"empty {DROPIN} (host data asks nothing beyond RKE2's own runtime now)" in emptied.stdout, emptied.stdout
    plain = cri_up(fleet, layout, other_than=back)
    line = sh(fleet, layout, f"grep -E 'starting cri plugin' {layout.log} | tail -n 1")
    loaded = parse_cri_start_log(line.splitlines())
    assert loaded["default_runtime_name"] == "runc" and loaded["enable_cdi"] is not False, line
    assert "default_runtime_name" not in sh(fleet, layout, f"cat {DROPIN}")
    settled = deploy(fleet, layout, "-y")
    assert settled.returncode == 0, settled.stdout
    assert f"{DROPIN} sets nothing" in settled.stdout, settled.stdout
    assert agent_pid(fleet, layout) == plain


def test_rke2_s_drop_in_directory_that_is_a_link_is_refused(fleet: Fleet) -> None:
    layout = BY_ID["rke2"]
    first = agent_node(fleet, layout)
    put(fleet, layout, TOOLKIT, TOOLKIT_STAND_IN, mode="755")
    sh(fleet, layout, f"systemctl restart {layout.unit}")
    pid = cri_up(fleet, layout, other_than=first)
    sh(fleet, layout, f"mkdir -p /srv/dropins && rm -rf {DROPINS} && ln -s /srv/dropins {DROPINS}")
    data = ("--data", "gpunode_nvidia_default_runtime=true")

    run = deploy(fleet, layout, "-y", *data)
    assert run.returncode != 0, run.stdout
    assert (
        f"containerd config not changed: {DROPINS} is a symbolic link to /srv/dropins: gpunode writes real files "
        "only, never through a link"
    ) in run.stdout, run.stdout
    assert sh(fleet, layout, "ls -A /srv/dropins").strip() == ""
    assert agent_pid(fleet, layout) == pid
