"""Report whether each GPU node is ready, link by link, changing nothing on any node.

pyinfra -y INVENTORY deploys/readiness.py                                   # exits non-zero if a node is not ready
pyinfra -y INVENTORY deploys/readiness.py --data gpunode_readiness_json=readiness.json
python -m pyinfra_gpunode.readiness_status --max-age 30m readiness.json  # 0 ready, 1 not ready, 2 not read, 3 stale
"""

from pyinfra_gpunode.pipelines.readiness import node_readiness_reported

node_readiness_reported()
