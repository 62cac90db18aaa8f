"""Prepare Kubernetes GPU worker nodes, host side, and restart containerd one node at a time.

pyinfra INVENTORY deploys/gpu_node.py --dry     # the plan
pyinfra -y INVENTORY deploys/gpu_node.py        # the run
"""

from pyinfra_gpunode.pipelines.gpu_node import gpu_node_prepared
from pyinfra_gpunode.pipelines.readiness import node_readiness_reported

gpu_node_prepared()
node_readiness_reported(fail_not_ready=False)  # each node's chain after the rollout (a dry run: as it is now)
