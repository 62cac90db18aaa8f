"""Report whether each GPU node is ready, link by link, changing nothing on any node.

pyinfra -y INVENTORY deploys/readiness.py                                   # exits non-zero if a node is not ready
pyinfra -y INVENTORY deploys/readiness.py --data gpunode_readiness_json=readiness.json
python -m pyinfra_gpunode.readiness_status readiness.json    # 0 ready, 1 a node not ready, 2 a node not read
"""

from pyinfra_gpunode.pipelines.readiness import node_readiness_reported

node_readiness_reported()
