"""Config trees the real-binary matrix is run on: what nodes in the field carry."""

from __future__ import annotations

from tests.realbin.debian import PACKAGES, containerd_binary
from tests.realbin.upstream import SOURCES

CONFIG = "/etc/containerd/config.toml"
CONFD = "/etc/containerd/conf.d"
V2 = '"io.containerd.grpc.v1.cri"'
V3 = '"io.containerd.cri.v1.runtime"'
V3_IMAGES = '"io.containerd.cri.v1.images"'
IMPORTS = f'imports = ["{CONFD}/*.toml"]\n'
# The supported lines Debian does not ship, built from upstream source (tests.realbin.upstream).
UPSTREAM = list(SOURCES)


def debian_config(version: str) -> str:
    """The config.toml Debian's containerd package ships (version 2, CRI cni dirs): the same file in every
    Debian release, so a line Debian does not ship (built from source) gets sid's, as an upgrade leaves it."""
    package = version if version in PACKAGES else "2.1.9"
    return (containerd_binary(package).parents[2] / "etc/containerd/config.toml").read_text()


def registry(config_path: str = "/etc/containerd/certs.d", schema: int = 2) -> str:
    plugin = f"{V2}.registry" if schema == 2 else f"{V3_IMAGES}.registry"
    return f'version = {schema}\n\n[plugins.{plugin}]\n  config_path = "{config_path}"\n'


def main_with_cri(schema: int = 2) -> str:
    """A config.toml with its own CRI section and markers the merged config must keep."""
    if schema == 2:
        return f"""version = 2
{IMPORTS}
# operator's own CRI settings
[plugins.{V2}]
  max_container_log_line_size = 12345

[plugins.{V2}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.{V2}.containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins.{V2}.registry]
  config_path = "/etc/containerd/certs.d-main"
"""
    return f"""version = 3
{IMPORTS}
# operator's own CRI settings
[plugins.{V3}]
  device_ownership_from_security_context = true

[plugins.{V3}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.{V3}.containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins.{V3_IMAGES}.registry]
  config_path = "/etc/containerd/certs.d-main"
"""


def toolkit_dropin() -> str:
    """What the toolkit's installer writes on 1.x: a CRI copy with three nvidia runtimes, default nvidia."""
    runtimes = ""
    for name, suffix in (("nvidia", ""), ("nvidia-cdi", ".cdi"), ("nvidia-legacy", ".legacy")):
        runtimes += f"""
[plugins.{V2}.containerd.runtimes.{name}]
  runtime_type = "io.containerd.runc.v2"

[plugins.{V2}.containerd.runtimes.{name}.options]
  BinaryName = "/usr/bin/nvidia-container-runtime{suffix}"
  SystemdCgroup = true
"""
    return f"""version = 2

[plugins.{V2}]
  enable_cdi = true

[plugins.{V2}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"

[plugins.{V2}.containerd]
  default_runtime_name = "nvidia"
{runtimes}"""


def runc_cgroup_only(schema: int = 2) -> str:
    """The snippet Kubernetes' docs give: only runc's ``SystemdCgroup``, no ``runtime_type``."""
    plugin = f"{V2}.containerd.runtimes.runc.options" if schema == 2 else f"{V3}.containerd.runtimes.runc.options"
    return f"version = {schema}\n{IMPORTS}\n[plugins.{plugin}]\n  SystemdCgroup = true\n"


def nvidia_default_image(schema: int = 3) -> str:
    """A GPU node image's config.toml: nvidia defined as the default with ``SystemdCgroup = true``, runc left out."""
    plugin = V3 if schema == 3 else V2
    return f"""version = {schema}
{IMPORTS}
[plugins.{plugin}.containerd]
  default_runtime_name = "nvidia"

[plugins.{plugin}.containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"

[plugins.{plugin}.containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
  SystemdCgroup = true
"""
