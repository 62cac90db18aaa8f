# shellcheck shell=sh
# Restart the unit k3s or RKE2 runs containerd in (their kubelet restarts with it), then wait until
# the config the agent generates at its start defines the nvidia runtime and the CRI plugin answers
# on the agent's socket.
# Usage: sh -c "$script" gpunode-platform-restart UNIT CONFIG ADDRESS TICKS PROGRAM
#   UNIT: the systemd unit; CONFIG: the config it generates; ADDRESS: its containerd's socket;
#   TICKS: how many times to look, 0.2 s apart; PROGRAM: k3s or rke2 (where its ctr lives)
# Exit status: 0 once verified; 1 with the reason as the last line on stderr.
unit=$1
config=$2
address=$3
ticks=$4
program=$5
nvidia="^[[:space:]]*\\[plugins\\.[\"'](io\\.containerd\\.grpc\\.v1\\.cri|io\\.containerd\\.cri\\.v1\\.runtime)[\"']\\.containerd\\.runtimes\\.[\"']?nvidia[\"']?\\]"
ctr=
for c in ctr "/var/lib/rancher/$program/bin/ctr" "/var/lib/rancher/$program/data/current/bin/ctr"; do
    if command -v "$c" >/dev/null 2>&1; then
        ctr=$c
        break
    fi
done
if [ -z "$ctr" ]; then
    echo "$unit not restarted: no ctr to verify it with (ctr on PATH, /var/lib/rancher/$program/bin/ctr)" >&2
    exit 1
fi
systemctl reset-failed "$unit" 2>/dev/null
start=$(date +%s)
if ! systemctl restart "$unit"; then
    echo "systemctl restart $unit failed" >&2
    exit 1
fi
why="$unit did not come up"
for _ in $(seq 1 "$ticks"); do
    s=$(systemctl show -p ActiveState --value "$unit")
    if [ "$s" = failed ] || [ "$s" = inactive ]; then
        why="$unit is $s after the restart"
        break
    fi
    if [ "$(stat -c %Y "$config" 2>/dev/null || echo 0)" -lt "$start" ]; then
        why="$unit did not regenerate $config"
    elif ! grep -qE "$nvidia" "$config"; then
        why="$config has no nvidia runtime after the restart"
    elif timeout 10 "$ctr" --address "$address" plugins ls 2>/dev/null |
        grep -qE '^io[.]containerd[.]grpc[.]v1 +cri .* ok *$'; then
        exit 0
    else
        why="the CRI plugin on $address is not up"
    fi
    sleep 0.2
done
echo "$unit restarted, not verified: $why" >&2
exit 1
