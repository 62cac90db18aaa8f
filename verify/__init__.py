"""Verification of prepared GPU nodes, shipped with the package and run by pytest:

    pytest --pyargs pyinfra_gpunode.verify --inventory INVENTORY [--gpunode-checks=containerd,gpu,host]

Each check reads the node with the same facts the deploys use (over SSH, as pyinfra connects).
"""
