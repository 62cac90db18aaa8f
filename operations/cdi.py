"""Keep the NVIDIA CDI spec in step with the loaded driver and the node's GPUs."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.cdi import CdiSpec, CdiSpecs, missing_devices
from pyinfra_gpunode.facts.nvidia import NvidiaDriver, NvidiaGpus
from pyinfra_gpunode.operations._atomic import fail
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact

DEFAULT_SPEC = "/etc/cdi/nvidia.yaml"


def refresh_reason(path: str, current: CdiSpec | None, loaded: str, gpu_count: int) -> str | None:
    """Why the spec at ``path`` must be generated again, or None when it is current."""
    if current is None:
        return f"CDI spec {path} is missing; generating it for driver {loaded}"
    if not same_driver(current["driver_version"], loaded):
        return f"CDI spec {path} is for driver {current['driver_version']}, regenerating it for driver {loaded}"
    missing = missing_devices(current, gpu_count)
    if missing:
        return (
            f"CDI spec {path} lists no device {', '.join(missing)} for the node's {gpu_count} GPU(s) "
            f"(it has {', '.join(current['devices']) or 'none'}); regenerating it"
        )
    return None


@operation()
@locked_before_changes
def spec(path: str = DEFAULT_SPEC) -> Generator[Any, Any, None]:
    """
    Generate the NVIDIA CDI spec with ``nvidia-ctk`` when it is missing, stale or incomplete.

    + path: spec file to write (``/etc/cdi/…`` or ``/var/run/cdi/…``, ``.yaml``); the default
      ``/etc/cdi/nvidia.yaml`` survives a reboot, while ``/var/run/cdi`` is a tmpfs emptied at boot

    The spec is current when the driver version of its ``libnvidia-ml.so.<version>`` host paths
    (or ``--host-driver-version``) equals the loaded kernel module's, and it lists every GPU on
    the node's PCI bus by index (``0``, ``1``, …) plus ``all``. It is written to a temporary file
    next to ``path`` and moved into place, so containers never see half a spec. Nodes without a
    loaded NVIDIA driver are skipped. A file at ``path`` that is not a CDI spec in YAML or JSON
    fails the host naming the file, and nothing is written.

    **Example:**

    .. code:: python

        cdi.spec(name="CDI spec matches the driver")
    """
    if not path.startswith(("/etc/cdi/", "/var/run/cdi/")) or not path.endswith(".yaml") or ".." in path:
        yield fail(f"CDI spec path must be a .yaml file in /etc/cdi/ or /var/run/cdi/, got {path!r}")
        return

    loaded = node_fact(NvidiaDriver)["kernel_module_version"]
    if not loaded:
        host.noop("no NVIDIA driver is loaded; CDI spec not generated")
        return
    current = {item["path"]: item for item in node_fact(CdiSpecs)}.get(path)
    if current is not None and current["error"]:
        yield fail(f"{current['error']}; move it away or fix it, then run again")
        return
    gpu_count = len(node_fact(NvidiaGpus)["gpus"])
    reason = refresh_reason(path, current, loaded, gpu_count)
    if reason is None:
        host.noop(f"CDI spec {path} matches driver {loaded} and lists the node's {gpu_count} GPU(s) and all")
        return
    tmp = f"{path}.gpunode-tmp"
    yield StringCommand("echo", QuoteString(reason))
    yield StringCommand("mkdir", "-p", QuoteString(path.rsplit("/", 1)[0]))
    yield StringCommand("nvidia-ctk", "cdi", "generate", "--format=yaml", QuoteString(f"--output={tmp}"))
    yield StringCommand("chmod", "644", QuoteString(tmp), "&&", "mv", "-f", QuoteString(tmp), QuoteString(path))
