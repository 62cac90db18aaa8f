#!/usr/bin/env bash
# Boot a local fleet of three test hosts (systemd-nspawn: node1 and node2 on Debian trixie with
# containerd 1.7, node3 on Debian sid with containerd 2.1), show the dry-run plan of the GPU-node
# deploy, run it, and print what changed on each node. Needs root; the fleet stays up afterwards.
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
if [ ! -f "$DEPLOY" ]; then
    echo "demo: $DEPLOY not found; using deploys/containerd_runtime.py" >&2
    DEPLOY=deploys/containerd_runtime.py
fi

echo "== 1/4 test fleet"
.venv/bin/python -m tests.fleet up
inventory=$(.venv/bin/python -c 'from tests.fleet import Fleet; print(Fleet().inventory_path)')

echo
echo "== 2/4 dry run: what $DEPLOY would change"
.venv/bin/pyinfra "$inventory" "$DEPLOY" --dry

echo
echo "== 3/4 deploy"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
.venv/bin/pyinfra -y "$inventory" "$DEPLOY" 2>&1 | tee "$log" || status=$?

echo
echo "== 4/4 what changed per node"
# pyinfra prints "--> Starting operation: NAME" and then "[host] Success" (changed) or
# "[host] No changes" for each host.
hosts=$(.venv/bin/python -c 'from tests.fleet import Fleet; print(" ".join(h.name for h in Fleet().hosts))')
for host in $hosts; do
    sed 's/\x1b\[[0-9;]*m//g' "$log" | awk -v host="$host" '
        /--> Starting (serial )?operation: / { op = $0; sub(/.*operation: /, "", op); sub(/ +$/, "", op) }
        index($0, "[" host "] Success") { print "    changed:   " op }
        index($0, "[" host "] Error") { print "    FAILED:    " op }
        index($0, "[" host "] No changes") { unchanged++ }
        BEGIN { print host ":" }
        END { printf "    unchanged: %d operation(s)\n", unchanged }'
done

echo
echo "The fleet is still up:  ssh -F $(dirname "$inventory")/ssh_config node1"
echo "Tear it down with:      sudo .venv/bin/python -m tests.fleet down"
exit "$status"
