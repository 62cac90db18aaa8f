"""The shape of a real cluster's inventory: GPU node groups, their data, strict host keys.

pyinfra inventories/example.py deploys/gpu_node.py --dry
"""

_ssh = {
    "ssh_user": "ubuntu",
    "_sudo": True,
    # Host keys are checked against a known_hosts file you maintain; unknown keys are refused.
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": "~/.ssh/known_hosts_gpu_nodes",
    # Same on every host: the canary's containerd restarts first, then the rest in inventory order.
    "gpunode_rollout_order": ["gpu-a100-01.example.internal"],
    "gpunode_toolkit_version": "1.17.8-1",
}

gpu_canary = (
    ["gpu-a100-01.example.internal"],
    {**_ssh, "gpunode_driver_version": "580.126.20"},
)

gpu_a100 = (
    ["gpu-a100-02.example.internal", "gpu-a100-03.example.internal"],
    {**_ssh, "gpunode_driver_version": "580.126.20"},
)

gpu_h100_nvswitch = (
    ["gpu-h100-01.example.internal", "gpu-h100-02.example.internal"],
    {
        **_ssh,
        "gpunode_driver_version": "580.126.20",
        "gpunode_driver_flavor": "server-open",
        "gpunode_nvidia_default_runtime": True,
    },
)
