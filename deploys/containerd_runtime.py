"""Register the nvidia runtime with containerd on every host of the inventory.

pyinfra -y INVENTORY deploys/containerd_runtime.py
pyinfra -y @chroot/<dir> deploys/containerd_runtime.py --data gpunode_containerd_restart=none
"""

from pyinfra_gpunode.pipelines.gpu_node import nvidia_runtime_registered

nvidia_runtime_registered()
