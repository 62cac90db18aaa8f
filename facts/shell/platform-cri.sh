# shellcheck shell=sh
# Print what the CRI plugin of a platform's own containerd (k3s, RKE2, k0s) loaded, its binaries in
# BIN_DIR first on PATH, each part after a line MARK<name>:
#   journal  the CRI plugin's start or failure lines (those `grep -E LINES` finds), from
#              pid PID          the journal's lines of the process PID (k0s), or
#              log LOG OFFSET   the last one in the file LOG past byte OFFSET (the whole file where it is
#                               shorter: rotated), in its last LIMIT bytes (k3s, RKE2)
#   ctr      the CRI plugins' lines of `ctr plugins ls` on the socket ADDRESS
# Usage: sh -c "$script" gpunode-platform-cri MARK LINES BIN_DIR ADDRESS LIMIT pid PID
#        sh -c "$script" gpunode-platform-cri MARK LINES BIN_DIR ADDRESS LIMIT log LOG OFFSET
# Exit status: 0.
mark=$1 lines=$2 bin_dir=$3 address=$4 limit=$5 source=$6
PATH=$bin_dir:$PATH
export PATH
echo "${mark}journal"
case $source in
pid)
    timeout 30 journalctl --no-pager -o cat _PID="$7" 2>/dev/null | grep -E "$lines" | tail -n 20
    ;;
log)
    log=$7 offset=$8
    if [ -f "$log" ] && [ -r "$log" ]; then
        if [ "$(stat -L -c %s "$log")" -lt "$offset" ]; then offset=0; fi
        tail -c +"$((offset + 1))" "$log" | tail -c "$limit" | grep -E "$lines" | tail -n 1
    fi
    ;;
esac
echo "${mark}ctr"
if [ -S "$address" ] && command -v ctr >/dev/null 2>&1; then
    timeout 10 ctr --address "$address" plugins ls 2>/dev/null | grep -E '^io[.]containerd[.](grpc[.]v1 +cri|cri[.]v1) '
fi
exit 0
