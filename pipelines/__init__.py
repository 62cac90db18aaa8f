"""The deploys' pipelines: pyinfra ``@deploy`` functions that validate host data, read each node once,
and call the operations in order (``gpu_node`` for deploys/gpu_node.py, ``readiness`` for the report).
The pure decisions they rely on live in the top-level package; these modules are where they meet pyinfra."""

from pyinfra_gpunode.operations._internals import faster_pyinfra

faster_pyinfra()
