"""pyinfra-gpunode: host-side preparation of Kubernetes GPU worker nodes with pyinfra."""
