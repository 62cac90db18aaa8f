#!/usr/bin/env bash
# Boot a local fleet of three test hosts (systemd-nspawn: node1 and node2 on Debian trixie with
# containerd 1.7, node3 on Debian sid with containerd 2.1), show the dry-run plan of the GPU-node
# deploy, run it (it ends with a summary of what changed on each node). Needs root; the fleet
# stays up afterwards.
#
#   sudo bash scripts/demo.sh
#   sudo DEPLOY=deploys/containerd_runtime.py bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "demo: needs root (overlay mounts, network namespaces, systemd-nspawn): sudo bash scripts/demo.sh" >&2
    exit 1
fi
bash scripts/setup.sh

DEPLOY=${DEPLOY:-deploys/gpu_node.py}

echo "== 1/3 test fleet"
.venv/bin/python -m tests.fleet up
inventory=$(.venv/bin/python -c 'from tests.fleet import Fleet; print(Fleet().inventory_path)')

echo
echo "== 2/3 dry run: what $DEPLOY would change (each node's plan)"
.venv/bin/pyinfra "$inventory" "$DEPLOY" --dry

echo
echo "== 3/3 deploy (ends with a summary per node)"
status=0
.venv/bin/pyinfra -y "$inventory" "$DEPLOY" || status=$?

echo
echo "The fleet is still up:  ssh -F $(dirname "$inventory")/ssh_config node1"
echo "Tear it down with:      sudo .venv/bin/python -m tests.fleet down"
exit "$status"
