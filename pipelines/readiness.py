"""The readiness report as a pyinfra ``@deploy``, driven by validated host data.

From the CLI ``deploys/readiness.py`` calls it; from Python::

    add_deploy(state, node_readiness_reported)
    run_ops(state)
    reports_of(state)   # pyinfra_gpunode.operations.readiness.reports_of: node name -> readiness.NodeReadiness
"""

from __future__ import annotations

import os

from pyinfra import host
from pyinfra.api import deploy

from pyinfra_gpunode.hostdata import HostDataError, world_writable_warnings
from pyinfra_gpunode.log import logger
from pyinfra_gpunode.operations import hostdata, readiness
from pyinfra_gpunode.operations._internals import prepared_kept
from pyinfra_gpunode.operations._shared import snapshot_binary
from pyinfra_gpunode.pipelines._settings import validated_settings


@deploy("Report GPU node readiness")
def node_readiness_reported(fail_not_ready: bool = True) -> None:
    """
    Report every node's chain (PCI device to device plugin) read-only, and the fleet summary;
    nodes that are not ready fail with their first broken link unless ``fail_not_ready`` is false.
    """
    try:
        settings = validated_settings()
        _check_json_path(settings.readiness.json_path)
    except HostDataError as error:
        hostdata.accepted(name="host data: accepted", error=str(error))
        return
    for warning in world_writable_warnings(settings):
        logger.warning("%s%s", host.print_prefix, warning)
    snapshot_binary(settings.runtime.binary)
    readiness.report_at_exit(settings.readiness.json_path)
    readiness.reported(
        name="readiness: every link of the chain",
        binary=settings.runtime.binary,
        cdi_spec_path=settings.cdi.spec_path,
        json_path=settings.readiness.json_path,
        fail_not_ready=fail_not_ready,
        cdi_spec_dirs=settings.containerd.cdi_spec_dirs,
        handler=settings.runtime.handler,
        mode=settings.containerd.mode,
        persistence_mode=settings.driver.persistence_mode,
    )
    prepared_kept()


def _check_json_path(path: str | None) -> None:
    """The report's JSON file must be writable on the controller, or every node is refused before it is read."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise HostDataError(
            f"host-data key 'gpunode_readiness_json' must name a file in a writable directory on the controller, "
            f"got {path!r}"
        )
