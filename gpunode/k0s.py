"""k0s nodes: the nvidia runtime as a drop-in in ``/etc/k0s/containerd.d/``, in the schema k0s accepts (no I/O).

What k0s does, as its sources have it (k0sproject/k0s):

- ``pkg/component/worker/containerd/component.go``: containerd runs as a child of the k0s unit
  (``k0sworker``, ``k0scontroller``) with ``--address=/run/k0s/containerd.sock
  --config=/etc/k0s/containerd.toml``; k0s rewrites that file at every start of containerd while its
  first line is ``# k0s_managed=true`` and leaves it alone otherwise; it watches
  ``/etc/k0s/containerd.d/`` and, 3 s after the last create, write, remove or rename there
  (``debounce.Debouncer``, ``Timeout: 3 * time.Second``), restarts containerd (SIGHUP, which ends it;
  its supervisor starts it again). The kubelet keeps running: only containerd restarts.
- k0s 1.36 and later (containerd 2.3; ``pkg/component/worker/containerd/configurer.go``,
  ``marshalContainerdConfig``): the managed file is ``version = 3`` with
  ``imports = ["/etc/k0s/containerd.d/*.toml"]``, so containerd itself deep-merges the drop-ins;
  ``ValidateConfigFile`` (run by k0s' pre-flight checks, ``internal/pkg/sysinfo/probes/containerd.go``)
  refuses a drop-in whose ``version`` is not 3 or that has a ``plugins."io.containerd.grpc.v1.cri"``
  table (``docs/runtime.md``: "Either omit the version field entirely or set it to version = 3").
- k0s 1.27.1 to 1.35 (containerd 1.7; ``configurer.go``'s ``handleImports`` at v1.35.7+k0s.0): the
  managed file is ``version = 2`` importing ``/run/k0s/containerd-cri.toml``, which k0s itself
  generates at each containerd restart from containerd's default CRI config with every drop-in that
  names ``io.containerd.grpc.v1.cri`` merged into it as a patch (other drop-ins are imported as they
  are). The merged result exists only after k0s restarted containerd, so gpunode cannot judge it
  before the write: such nodes are refused, naming the drop-in to write by hand.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pyinfra_gpunode import node_toml
from pyinfra_gpunode.containerd_dropin import CRI_V2, Options
from pyinfra_gpunode.platform import K0S_CONFIG, K0S_DROPINS, K0S_MARKER, K0S_SOCKET
from pyinfra_gpunode.versions import ContainerdVersionInfo

ROOT = "/etc/k0s"  # k0s' config directory: the main config and the drop-in directory
DROPIN = f"{K0S_DROPINS}/nvidia-gpunode.toml"
IMPORTS = f"{K0S_DROPINS}/*.toml"  # the managed file's import of the drop-ins (k0s 1.36 and later)
BIN_DIR = "/var/lib/k0s/bin"  # where k0s puts its containerd, ctr and runc (K0sVars.BinDir)
DEBOUNCE_SECONDS = 3  # k0s restarts containerd this long after the last change in K0S_DROPINS
BACKUP_NAME = "k0s-containerd"  # backups: <BACKUP_DIR>/k0s-containerd-<time>.tar


def options(base: Options) -> Options:
    """``base`` with k0s' drop-in directory and our file in it (``gpunode_dropin_dir`` does not apply)."""
    return replace(base, dropin_dir=K0S_DROPINS, dropin_path=DROPIN, config_root=ROOT)


def _imports(text: str) -> list[str] | None:
    try:
        imports = node_toml.loads(text).get("imports")
    except tomllib.TOMLDecodeError:
        return None
    return [str(entry) for entry in imports] if isinstance(imports, list) else []


def layout_problem(version: ContainerdVersionInfo | None, texts: Mapping[str, str]) -> str | None:
    """
    Why gpunode does not write a drop-in on this k0s node, or ``None`` where it does: the managed
    ``/etc/k0s/containerd.toml`` of k0s 1.36 or later (containerd 2.x, importing
    ``/etc/k0s/containerd.d/*.toml``). ``texts``: the config files read from the node.
    """
    main = texts.get(K0S_CONFIG)
    if version is None:
        return f"k0s' containerd binary was not found (on PATH or in {BIN_DIR}/)"
    if main is None:
        return f"{K0S_CONFIG} is missing: start k0s once so that it writes it"
    if main.split("\n", 1)[0].rstrip("\r") != K0S_MARKER:
        return (
            f"{K0S_CONFIG} is not k0s-managed (its first line is not {K0S_MARKER!r}), so k0s imports no "
            f"drop-ins: add the nvidia runtime to that file yourself"
        )
    if version["major"] < 2:
        return (
            f"k0s runs containerd {version['raw']} here (k0s 1.35 or earlier): it merges drop-ins that name "
            f"io.containerd.grpc.v1.cri into its own CRI config (/run/k0s/containerd-cri.toml) only when it "
            "restarts containerd, so gpunode cannot check the result before writing and does not write "
            f'there; put a version-2 drop-in with [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.'
            f"nvidia] in {K0S_DROPINS}/ yourself, or upgrade to k0s 1.36 or later"
        )
    imports = _imports(main)
    if imports is None or IMPORTS not in imports:
        return (
            f"{K0S_CONFIG} does not import {IMPORTS} (it is not the file k0s 1.36 or later writes), so a "
            f"drop-in there would not be read"
        )
    return None


def refusal(evidence: list[str], why: str) -> str:
    """The refusal of a k0s node whose layout gpunode does not write (``layout_problem``'s ``why``)."""
    return (
        f"k0s owns containerd here (socket {K0S_SOCKET}, config {K0S_CONFIG}); gpunode writes no drop-in in "
        f"{K0S_DROPINS}/ on this node: {why}; nothing was changed on this node (found: {'; '.join(evidence)})"
    )


def dropin_problems(text: str) -> list[str]:
    """Why k0s (1.36 and later) would refuse our drop-in, as its ``ValidateConfigFile`` does: a
    ``version`` other than 3, a ``plugins."io.containerd.grpc.v1.cri"`` table; ``[]`` when none."""
    try:
        data: dict[str, Any] = node_toml.loads(text)
    except tomllib.TOMLDecodeError as error:
        return [f"{DROPIN}: invalid TOML: {error}"]
    problems = []
    if "version" in data and data["version"] != 3:
        problems.append(f"{DROPIN}: version = {data['version']!r}; k0s takes drop-ins of version 3 or none")
    plugins = data.get("plugins")
    if isinstance(plugins, dict) and CRI_V2 in plugins:
        problems.append(f"{DROPIN}: names {CRI_V2}, which k0s refuses in drop-ins")
    return problems


def write_line(unit: str | None) -> str:
    """What the plan says the write does on a k0s node."""
    where = unit or "the k0s unit"
    return (
        f"write {DROPIN}: k0s restarts its containerd about {DEBOUNCE_SECONDS} s later (the write is the "
        f"restart; the kubelet keeps running: k0s restarts only containerd, in {where}), then verify on "
        f"{K0S_SOCKET}"
    )
