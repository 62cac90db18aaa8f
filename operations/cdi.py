"""Keep the NVIDIA CDI spec in step with the loaded driver."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from pyinfra_gpunode.driver_versions import same_driver
from pyinfra_gpunode.facts.cdi import CdiSpecs
from pyinfra_gpunode.facts.nvidia import NvidiaDriver

DEFAULT_SPEC = "/var/run/cdi/nvidia.yaml"


@operation()
def spec(path: str = DEFAULT_SPEC) -> Generator[Any, Any, None]:
    """
    Generate the NVIDIA CDI spec with ``nvidia-ctk`` when it is missing or stale.

    + path: spec file to write (``/etc/cdi/…`` or ``/var/run/cdi/…``, ``.yaml``)

    A spec is stale when the driver version of its ``libnvidia-ml.so.<version>`` host paths
    differs from the loaded kernel module. The spec is written to a temporary file next to
    ``path`` and moved into place, so containers never see half a spec. Nodes without a
    loaded NVIDIA driver are skipped.

    **Example:**

    .. code:: python

        cdi.spec(name="CDI spec matches the driver")
    """
    if not path.startswith(("/etc/cdi/", "/var/run/cdi/")) or not path.endswith(".yaml") or ".." in path:
        raise OperationValueError(f"path must be a .yaml file in /etc/cdi/ or /var/run/cdi/, got {path!r}")

    loaded = host.get_fact(NvidiaDriver)["kernel_module_version"]
    if not loaded:
        host.noop("no NVIDIA driver is loaded; CDI spec not generated")
        return
    specs = {item["path"]: item for item in host.get_fact(CdiSpecs)}
    current = specs.get(path)
    if current is not None and same_driver(current["driver_version"], loaded):
        host.noop(f"CDI spec {path} matches driver {loaded}")
        return
    if current is None:
        reason = f"CDI spec {path} is missing; generating it for driver {loaded}"
    else:
        reason = f"CDI spec {path} is for driver {current['driver_version']}, regenerating it for driver {loaded}"
    tmp = f"{path}.gpunode-tmp"
    yield StringCommand("echo", QuoteString(reason))
    yield StringCommand("mkdir", "-p", QuoteString(path.rsplit("/", 1)[0]))
    yield StringCommand("nvidia-ctk", "cdi", "generate", "--format=yaml", QuoteString(f"--output={tmp}"))
    yield StringCommand("chmod", "644", QuoteString(tmp), "&&", "mv", "-f", QuoteString(tmp), QuoteString(path))
