# shellcheck shell=sh
# Wait until a platform has started a new containerd after a change of its drop-ins (k0s does so about
# 3 s after the last change in /etc/k0s/containerd.d; k3s and RKE2 when their unit restarts): a
# containerd process in UNIT other than OLD (0: any), whose CRI plugin logged its start or its failure
# (under its own PID in the journal, or, with LOG, in LOG past byte OFFSET), or (2 s on, where its lines
# reach neither) ctr on ADDRESS lists the CRI plugin.
# Usage: sh -c "$script" gpunode-platform-wait UNIT OLD TICKS ADDRESS BIN [LOG OFFSET]
#   UNIT: the platform's unit; OLD: the containerd PID before the change; TICKS: how many times to look,
#   0.2 s apart; ADDRESS: the platform's containerd socket, for ctr; BIN: where the platform's ctr lies;
#   LOG, OFFSET: the file the platform sends its containerd's output to, and its size before the change.
# Exit status: always 0; the facts read afterwards judge the result.
unit=$1
old=$2
ticks=$3
address=$4
PATH=$5:$PATH
export PATH
log=${6:-}
offset=${7:-0}
lines='Start cri plugin with config|starting cri plugin|failed to load plugin io.containerd.(grpc.v1.cri|cri)|failed to load plugin" error=.* id=io.containerd.(grpc.v1.cri|cri.v1.[a-z]+)( |$)'
n=0
for _ in $(seq 1 "$ticks"); do
    new=
    for p in $(pgrep -x containerd 2>/dev/null); do
        u=$(awk -F: '$3 != "/" && ($2 == "" || $2 == "name=systemd") {n = split($3, a, "/"); print a[n]; exit}' \
            "/proc/$p/cgroup" 2>/dev/null)
        if [ "$u" = "$unit" ] && [ "$p" != "$old" ]; then new=$p; fi
    done
    if [ -n "$new" ]; then
        if [ -n "$log" ]; then
            o=$offset
            if [ "$(stat -L -c %s "$log" 2>/dev/null || echo 0)" -lt "$o" ]; then o=0; fi
            tail -c +"$((o + 1))" "$log" 2>/dev/null | grep -qE "$lines" && break
        else
            journalctl --no-pager -o cat _PID="$new" 2>/dev/null | grep -qE "$lines" && break
        fi
        n=$((n + 1))
        if [ "$n" -ge 10 ] && timeout 10 ctr --address "$address" plugins ls 2>/dev/null |
            grep -qE '^io[.]containerd[.](grpc[.]v1 +cri|cri[.]v1) '; then
            break
        fi
    fi
    sleep 0.2
done
true
