# shellcheck shell=sh
# Wait until k0s has restarted its containerd after a change in /etc/k0s/containerd.d (k0s does so
# about 3 s after the last change): a containerd process in UNIT other than OLD (0: any), whose CRI
# plugin logged its start or its failure under its own PID in the journal, or (2 s on, where its
# lines reach the journal under k0s' PID instead) ctr on ADDRESS lists the CRI plugin.
# Usage: sh -c "$script" gpunode-k0s-wait UNIT OLD TICKS ADDRESS
#   UNIT: the k0s unit; OLD: the containerd PID before the change; TICKS: how many times to look,
#   0.2 s apart; ADDRESS: k0s' containerd socket, for ctr.
# Exit status: always 0; the facts read afterwards judge the result.
unit=$1
old=$2
ticks=$3
address=$4
PATH=/var/lib/k0s/bin:$PATH
export PATH
n=0
for _ in $(seq 1 "$ticks"); do
    new=
    for p in $(pgrep -x containerd 2>/dev/null); do
        u=$(awk -F: '$3 != "/" && ($2 == "" || $2 == "name=systemd") {n = split($3, a, "/"); print a[n]; exit}' \
            "/proc/$p/cgroup" 2>/dev/null)
        if [ "$u" = "$unit" ] && [ "$p" != "$old" ]; then new=$p; fi
    done
    if [ -n "$new" ]; then
        journalctl --no-pager -o cat _PID="$new" 2>/dev/null |
            grep -qE 'Start cri plugin with config|starting cri plugin|failed to load plugin io.containerd.(grpc.v1.cri|cri)|failed to load plugin" error=.* id=io.containerd.(grpc.v1.cri|cri.v1.[a-z]+)( |$)' &&
            break
        n=$((n + 1))
        if [ "$n" -ge 10 ] && timeout 10 ctr --address "$address" plugins ls 2>/dev/null |
            grep -qE '^io[.]containerd[.](grpc[.]v1 +cri|cri[.]v1) '; then
            break
        fi
    fi
    sleep 0.2
done
true
