"""Prepare Kubernetes GPU worker nodes, host side, and restart containerd one node at a time.

    pyinfra INVENTORY deploys/gpu_node.py --dry     # the plan
    pyinfra -y INVENTORY deploys/gpu_node.py        # the run
"""

from pyinfra_gpunode.pipeline import gpu_node_prepared

gpu_node_prepared()
