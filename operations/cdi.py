"""Keep the NVIDIA CDI spec in step with the loaded driver and the node's GPUs."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_gpunode import shell
from pyinfra_gpunode.cdi_checks import CdiSpec, missing_devices
from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.cdi import (
    REFRESH_DROPIN,
    REFRESH_SERVICE,
    CdiRefreshUnits,
    CdiSpecs,
    refresh_installed,
)
from pyinfra_gpunode.facts.driver import NvidiaDriver
from pyinfra_gpunode.facts.gpus import NvidiaGpus
from pyinfra_gpunode.facts.operator import GpuOperatorState
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations._atomic import fail, write_file
from pyinfra_gpunode.operations._lock import locked_before_changes
from pyinfra_gpunode.operations._shared import node_fact
from pyinfra_gpunode.operator import DRIVER_ROOT, driver_from_container
from pyinfra_gpunode.settings import CDI_SPEC_PATH
from pyinfra_gpunode.toolkit_plan import REFRESH_DROPIN_TEXT, REFRESH_SPEC, cdi_owner

DEFAULT_SPEC = CDI_SPEC_PATH
# Start the toolkit's refresh service and require its spec (shell/cdi-refresh.sh).
_REFRESH = shell.script(Path(__file__).parent / "shell" / "cdi-refresh.sh")


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
def spec(path: str = DEFAULT_SPEC, owner: str = "project") -> Generator[Any, Any, None]:
    """
    Generate the NVIDIA CDI spec with ``nvidia-ctk`` when it is missing, stale or incomplete.

    + path: spec file to write (``/etc/cdi/…`` or ``/var/run/cdi/…``, ``.yaml``); the default
      ``/etc/cdi/nvidia.yaml`` survives a reboot, while ``/var/run/cdi`` is a tmpfs emptied at boot
    + owner: who writes the spec: ``project`` (this operation, at ``path``), ``refresh`` (the
      toolkit's ``nvidia-cdi-refresh.service``, 1.18 and later, at ``/var/run/cdi/nvidia.yaml``) or
      ``auto`` (``refresh`` where that service is installed and the driver is the host's, else
      ``project``: the service cannot see a driver in the GPU Operator's driver container)

    The spec is current when the driver version of its ``libnvidia-ml.so.<version>`` host paths
    (or ``--host-driver-version``) equals the loaded kernel module's, and it lists every GPU on
    the node's PCI bus by index (``0``, ``1``, …) plus ``all``. It is written to a temporary file
    next to ``path`` and moved into place, so containers never see half a spec. Nodes without a
    loaded NVIDIA driver are skipped. A file at ``path`` that is not a CDI spec in YAML or JSON
    fails the host naming the file, and nothing is written.

    Where the refresh service owns the spec, this operation never writes ``path``: when the
    service's spec is missing, stale or incomplete it starts the service and reads its result
    (the host fails with the service's journal when it fails or writes no spec), and a spec it
    finds at ``path`` is reported as a duplicate (a warning), left in place.

    **Example:**

    .. code:: python

        cdi.spec(name="CDI spec matches the driver")
        cdi.spec(name="CDI spec kept by the toolkit's refresh service", owner="auto")
    """
    if not path.startswith(("/etc/cdi/", "/var/run/cdi/")) or not path.endswith(".yaml") or ".." in path:
        yield fail(f"CDI spec path must be a .yaml file in /etc/cdi/ or /var/run/cdi/, got {path!r}")
        return

    units = owner != "project" and refresh_installed(node_fact(CdiRefreshUnits))
    who, error = cdi_owner(owner, units)
    if error:
        yield fail(error)
        return
    driver = node_fact(NvidiaDriver)
    loaded = driver["kernel_module_version"]
    if not loaded:
        host.noop("no NVIDIA driver is loaded; CDI spec not generated")
        return
    operator = node_fact(GpuOperatorState) if who == "refresh" else None
    if operator is not None and driver_from_container(driver, operator):
        # The refresh unit cannot see a driver container's driver: the project generates from its root.
        who, error = cdi_owner(owner, units, driver_container=True)
        if error:
            yield fail(error)
            return
    if who == "refresh":
        yield from _refreshed(path, loaded)
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
    # A driver from the GPU Operator's driver container: its libraries lie under the container's root.
    found = node_fact(GpuOperatorState)
    root = [f"--driver-root={DRIVER_ROOT}"] if driver_from_container(driver, found) else []
    yield StringCommand("echo", QuoteString(reason))
    yield StringCommand("mkdir", "-p", QuoteString(path.rsplit("/", 1)[0]))
    yield StringCommand("nvidia-ctk", "cdi", "generate", "--format=yaml", *root, QuoteString(f"--output={tmp}"))
    yield StringCommand("chmod", "644", QuoteString(tmp), "&&", "mv", "-f", QuoteString(tmp), QuoteString(path))


def _refreshed(path: str, loaded: str) -> Generator[Any, Any, None]:
    """The refresh service's spec current for ``loaded`` (the service started when it is not); a spec the
    project would write at ``path`` reported as a duplicate."""
    specs = {item["path"]: item for item in node_fact(CdiSpecs)}
    if path != REFRESH_SPEC and path in specs:
        logger.warning(
            "%sCDI spec %s duplicates %s, which %s owns: left in place; remove it (the spec in /var/run/cdi "
            "wins for every device both define) or set gpunode_cdi_owner: project",
            host.print_prefix, path, REFRESH_SPEC, REFRESH_SERVICE,
        )  # fmt: skip
    current = specs.get(REFRESH_SPEC)
    if current is not None and current["error"]:
        yield fail(f"{current['error']}; {REFRESH_SERVICE} owns it: run `systemctl start {REFRESH_SERVICE}`")
        return
    gpu_count = len(node_fact(NvidiaGpus)["gpus"])
    reason = refresh_reason(REFRESH_SPEC, current, loaded, gpu_count)
    if reason is None:
        host.noop(f"CDI spec {REFRESH_SPEC} of {REFRESH_SERVICE} matches driver {loaded} and lists every GPU")
        return
    yield StringCommand("echo", QuoteString(f"{reason} with {REFRESH_SERVICE}"))
    yield StringCommand(shell.command(_REFRESH, "gpunode-cdi-refresh", REFRESH_SERVICE, REFRESH_SPEC))


@operation()
@locked_before_changes
def refresh_start_limit() -> Generator[Any, Any, None]:
    """
    Give the toolkit's ``nvidia-cdi-refresh.service`` no start limit, where it is installed.

    The drop-in ``/etc/systemd/system/nvidia-cdi-refresh.service.d/gpunode.conf`` sets
    ``StartLimitIntervalSec=0``: a refresh started again and again at boot (its ``.path`` unit
    fires on every module and toolkit change) is never left failed by the start limit. Nodes
    without the service (toolkit before 1.18) are left alone.

    **Example:**

    .. code:: python

        cdi.refresh_start_limit(name="CDI refresh: no start limit")
    """
    units = node_fact(CdiRefreshUnits)
    if not refresh_installed(units):
        host.noop(f"{REFRESH_SERVICE} is not installed")
        return
    if units["dropin"] == REFRESH_DROPIN_TEXT:
        host.noop(f"{REFRESH_SERVICE} has no start limit")
        return
    yield from write_file(REFRESH_DROPIN, REFRESH_DROPIN_TEXT)
    yield StringCommand("systemctl", "daemon-reload")
