# shellcheck shell=sh
# Restart containerd (after clearing a start-limit-hit state), then wait until the unit is active
# and the CRI plugin of this invocation logged its start or its failure, or (2 s on, for a
# containerd that logs above info) ctr lists the CRI plugin, or the unit gave up.
# Usage: sh -c "$script" gpunode-restart TICKS ADDRESS
#   TICKS: how many times to look, 0.2 s apart; ADDRESS: containerd's gRPC socket, for ctr.
# Exit status: always 0; the facts read afterwards judge the result.
ticks=$1
address=$2
systemctl reset-failed containerd 2>/dev/null
if systemctl restart containerd; then
    n=0
    for _ in $(seq 1 "$ticks"); do
        s=$(systemctl show -p ActiveState --value containerd)
        if [ "$s" = active ]; then
            id=$(systemctl show -p InvocationID --value containerd)
            journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" |
                grep -qE 'Start cri plugin with config|starting cri plugin|failed to load plugin io.containerd.(grpc.v1.cri|cri)' &&
                break
            n=$((n + 1))
            if [ "$n" -ge 10 ] && timeout 10 ctr --address "$address" plugins ls 2>/dev/null |
                grep -qE '^io[.]containerd[.]grpc[.]v1 +cri '; then
                break
            fi
        elif [ "$s" = failed ] || [ "$s" = inactive ]; then
            break
        fi
        sleep 0.2
    done
fi
true
