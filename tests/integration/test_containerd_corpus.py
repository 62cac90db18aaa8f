"""Real containerd configs (tests/corpus/containerd) through deploys/containerd_runtime.py.

Each corpus file is put as a Debian root's /etc/containerd/config.toml (with its drop-ins: a file
``<name>+<drop-in>.toml`` goes to ``/etc/containerd/conf.d/<drop-in>.toml``), the deploy is run
through the pyinfra CLI on every root at once (``@chroot``, ``gpunode_containerd_restart=none``),
twice, and the node's own ``containerd config dump`` judges the result: trixie's containerd 1.7.24,
sid's 2.1.9, and 2.3.4 and a 2.4 build from upstream source in a sid root whose containerd binaries are
swapped for them (as a node upgraded to those lines has them). A file the project must refuse names the text
its refusal must contain.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyinfra_gpunode.containerd_dropin import CRI_V2, CRI_V3_IMAGES, CRI_V3_RUNTIME, FILLED_IN, flatten
from pyinfra_gpunode.containerd_dump import summarize
from pyinfra_gpunode.containerd_files import ConfigFile, load_order, resolve_tree
from pyinfra_gpunode.containerd_losses import lost_settings
from tests import cli
from tests.fleet.roots import RootRecipe, bound_file, ensure_root, writable_copy
from tests.realbin.debian import containerd_binary
from tests.realbin.scenarios import UPSTREAM

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests/corpus/containerd"
BINARY = "/usr/bin/nvidia-container-runtime"
RELEASES = {"1.7.24": "trixie", "2.1.9": "sid", **{version: "sid" for version in UPSTREAM}}
OURS = ("containerd.runtimes.nvidia.", "enable_cdi", "cdi_spec_dirs")
EXPLICIT = "containerd.runtimes.nvidia.options.BinaryName"  # the deploy's input, whatever a file says
pytestmark = pytest.mark.containerd


@dataclass(frozen=True)
class Case:
    """A corpus file, a containerd version it is meant for, and the outcome the project must reach."""

    name: str
    version: str
    refusal: str | None = None  # the refusal the project must give (text in its error); None: must pass

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"


BOTH = ("1.7.24", "2.1.9", *UPSTREAM)  # files meant for 1.7 and 2.x
V2X = ("2.1.9", *UPSTREAM)  # files meant for 2.x only
CASES = [Case("debian-packaged", v) for v in BOTH] + [
    *(Case("kubeadm-default-1.7", v) for v in BOTH),
    *(Case("kubeadm-default-2.1", v) for v in V2X),
    *(Case("containerd-default-2.3", v) for v in UPSTREAM),
    *(Case("kubespray-v2", v) for v in BOTH),
    *(Case("kubespray-v3", v) for v in V2X),
    *(Case("nvidia-ctk-inplace", v) for v in BOTH),
    *(Case("nvidia-ctk-inplace-default", v) for v in BOTH),
    *(Case("nvidia-ctk-dropin", v) for v in BOTH),
    # A version 3 drop-in over a version 2 root: v2.3.0-v2.3.4 refuse to start (their own dump says so),
    # 2.4 migrates and merges it.
    Case(
        "nvidia-ctk-command-skew",
        "2.3.4",
        refusal="version 2 (/etc/containerd/conf.d/99-nvidia.toml has a version above",
    ),
    Case("nvidia-ctk-command-skew", "2.4.0-dev"),
    # The operator's toolkit manages the runtime there: refused unless gpunode_take_over_runtime.
    *(Case("gpu-operator-toolkit", v, refusal="toolkit.enabled=false") for v in BOTH),
    *(Case("gpu-operator-toolkit-v3", v, refusal="toolkit.enabled=false") for v in V2X),
    *(Case("aks-gpu-v2", v) for v in BOTH),
    *(Case("aks-gpu-containerd2", v) for v in V2X),
    *(Case("gke-cos-mirrors", v) for v in BOTH),
    *(Case("gke-mirrors-and-config-path", v, refusal="config_path") for v in BOTH),
    *(Case("eks-al2023-gpu-v2", v) for v in BOTH),
    *(Case("eks-al2023-gpu-v3", v) for v in V2X),
    *(Case("docker-containerd-io", v, refusal="the CRI plugin is disabled") for v in BOTH),
    *(Case("registry-auth", v) for v in BOTH),
]


def corpus_files(name: str) -> dict[str, Path]:
    """Node path -> corpus file: ``<name>.toml`` is config.toml, ``<name>+<x>.toml`` is conf.d/<x>.toml."""
    files = {"/etc/containerd/config.toml": CORPUS / f"{name}.toml"}
    for dropin in sorted(CORPUS.glob(f"{name}+*.toml")):
        files[f"/etc/containerd/conf.d/{dropin.name.split('+', 1)[1]}"] = dropin
    return files


@dataclass
class Node:
    case: Case
    root: Path
    before: dict[str, Any]
    tree_before: dict[str, tuple[bytes, int]]
    first: list[str] | None = None  # this node's lines of the first run
    after: dict[str, Any] | None = None
    tree_after: dict[str, tuple[bytes, int]] | None = None
    second: list[str] | None = None
    tree_again: dict[str, tuple[bytes, int]] | None = None


def dump(root: Path) -> dict[str, Any]:
    """The root's merged config, or ``{}`` where its containerd refuses the files (a case that must be refused)."""
    done = subprocess.run(["chroot", str(root), "containerd", "config", "dump"], capture_output=True, text=True)
    return tomllib.loads(done.stdout) if done.returncode == 0 else {}


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under the node's /etc/containerd: content and mode, owner and group."""
    base = root / "etc/containerd"
    return {
        str(path.relative_to(base)): (path.read_bytes(), path.stat().st_mode, path.stat().st_uid, path.stat().st_gid)
        for path in sorted(base.rglob("*"))
        if path.is_file()
    }


def node_lines(output: str, root: Path) -> list[str]:
    tag = f"[@chroot/{root}]"
    return [line.strip() for line in output.splitlines() if tag in line]


def deploy(nodes: list[Node], inventory: Path) -> str:
    """deploys/containerd_runtime.py on every node at once (an inventory file: the hosts do not fit one argument)."""
    inventory.write_text(f"corpus = {[f'@chroot/{node.root}' for node in nodes]!r}\n")
    done = cli.pyinfra(
        inventory,
        "deploys/containerd_runtime.py",
        "-y",
        "--data",
        "gpunode_containerd_restart=none",
        merged=False,
    )
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def corpus_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Node]]:
    """The selected cases, each on its own copy of a Debian root, deployed twice in two pyinfra runs."""
    wanted = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec") and "case" in item.callspec.params
    ]
    roots = {version: ensure_root(RootRecipe(release)) for version, release in RELEASES.items()}
    with ExitStack() as mounts:
        nodes: dict[str, Node] = {}
        for case in wanted:
            root = mounts.enter_context(writable_copy(roots[case.version], tmp_path_factory.mktemp(case.name)))
            # No daemon runs in a root: ctr would wait 10 s for its socket on every run.
            (root / "usr/bin/ctr").unlink()
            if case.version in UPSTREAM:
                mounts.enter_context(bound_file(containerd_binary(case.version), root / "usr/bin/containerd"))
            for path, source in corpus_files(case.name).items():
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read_bytes())
            nodes[case.id] = Node(case, root, dump(root), tree(root))
        if nodes:
            inventory = tmp_path_factory.mktemp("inventory") / "corpus.py"
            first = deploy(list(nodes.values()), inventory)
            for node in nodes.values():
                node.first, node.after, node.tree_after = node_lines(first, node.root), dump(node.root), tree(node.root)
            second = deploy(list(nodes.values()), inventory)
            for node in nodes.values():
                node.second, node.tree_again = node_lines(second, node.root), tree(node.root)
        yield nodes


def files_of(tree: dict[str, tuple[Any, ...]]) -> list[ConfigFile]:
    """The node's config files in containerd's load order, from its /etc/containerd tree."""
    texts = {f"/etc/containerd/{path}": content.decode() for path, (content, *_) in tree.items()}
    return load_order(resolve_tree("/etc/containerd/config.toml", texts))


def cri_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Every CRI leaf of a config, dotted within its plugin table (v2 and v3 names alike)."""
    plugins = data.get("plugins", {})
    out: dict[str, Any] = {}
    for name in (CRI_V2, CRI_V3_RUNTIME, CRI_V3_IMAGES):
        out.update(flatten(plugins.get(name, {})))
    return out


def user_set(case: Case) -> set[str]:
    keys: set[str] = set()
    for source in corpus_files(case.name).values():
        keys |= set(cri_keys(tomllib.loads(source.read_text())))
    return keys


def changed_keys(before: dict[str, Any], after: dict[str, Any], users: set[str]) -> list[str]:
    """CRI keys whose value the run changed or removed, less the ones the project owns (unless a
    user's file sets them), empty values containerd fills in and zero values left unset."""
    was, now = cri_keys(before), cri_keys(after)
    changed = []
    for key, value in was.items():
        if key == EXPLICIT or (key.startswith(OURS) and key not in users):
            continue
        if now.get(key) == value or (value == "" and key.rsplit(".", 1)[-1] in FILLED_IN):
            continue
        if key not in now and value in ("", False, 0, [], {}):  # a Go zero value: the same as unset
            continue
        changed.append(f"{key}: {value!r} -> {now.get(key, '<missing>')!r}")
    return changed


def registry_conflict(data: dict[str, Any]) -> bool:
    """Legacy mirrors and config_path together: containerd's CRI plugin refuses that at start."""
    plugins = data.get("plugins", {})
    for name in (CRI_V2, CRI_V3_IMAGES):
        registry = plugins.get(name, {}).get("registry", {})
        if registry.get("mirrors") and registry.get("config_path"):
            return True
    return False


def params() -> list[Any]:
    return [pytest.param(case, id=case.id) for case in CASES]


@pytest.mark.parametrize("case", params())
def test_corpus_config(corpus_run: dict[str, Node], case: Case) -> None:
    node = corpus_run[case.id]
    assert node.first is not None and node.after is not None and node.second is not None
    failed = [line for line in node.first if "Error" in line or "containerd config not changed" in line]
    if case.refusal:
        assert failed, "\n".join(node.first)
        assert any(case.refusal in line for line in node.first), "\n".join(node.first)
        assert node.tree_after == node.tree_before
        return
    assert not failed, "\n".join(node.first)
    before, after = summarize(node.before), summarize(node.after)
    assert after["runtimes"].get("nvidia", {}).get("BinaryName") == BINARY, after["runtimes"]
    assert set(before["runtimes"]) <= set(after["runtimes"]), after["runtimes"]
    assert (after["default_runtime_name"] or "runc") == (before["default_runtime_name"] or "runc")
    default = after["runtimes"][after["default_runtime_name"] or "runc"]
    if "containerd.runtimes.nvidia.options.SystemdCgroup" not in user_set(case):
        assert bool(after["runtimes"]["nvidia"]["SystemdCgroup"]) == bool(default["SystemdCgroup"]), after["runtimes"]
    assert changed_keys(node.before, node.after, user_set(case)) == []
    assert not registry_conflict(node.after)
    # Every setting of every file is what containerd merged: nothing of the node's files lost on the way.
    assert lost_settings(node.after, files_of(node.tree_after)) == []

    # A second run changes nothing.
    assert not any("Success" in line or "Error" in line for line in node.second), "\n".join(node.second)
    assert node.tree_again == node.tree_after
