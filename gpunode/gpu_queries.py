"""How long the node's GPU queries may take before the GPU counts as wedged (no I/O).

nvidia-smi answers in well under a second on a sound GPU, NVML's init and queries in a second or two on an
8-GPU node; on a wedged GPU or driver either may never answer (stuck in the kernel, out of reach of a
signal). The node's programs leave such a query behind after these seconds and say so.
"""

SMI_SECONDS = 10
NVML_SECONDS = 20
