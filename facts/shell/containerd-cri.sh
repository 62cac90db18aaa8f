# shellcheck shell=sh
# Print what the CRI plugin of the containerd in the systemd unit UNIT loaded, each part after a line
# MARK<name>:
#   journal  the CRI plugin's start or failure lines (those `grep -E LINES` finds) in the journal of the
#            unit's current run; without
#            them, the last such line in the last LIMIT bytes of the file LOG ("": none), where a
#            platform writes its containerd's log
#   ctr      only without such a line: the CRI plugins' lines of `ctr plugins ls` on the socket ADDRESS,
#            and the plugin's message where one did not load
# Usage: sh -c "$script" gpunode-containerd-cri MARK LINES ADDRESS UNIT LOG LIMIT
# Exit status: 0.
mark=$1 lines=$2 address=$3 unit=$4 log=$5 limit=$6
echo "${mark}journal"
id=$(systemctl show -p InvocationID --value "$unit" 2>/dev/null)
j=
if [ -n "$id" ]; then j=$(timeout 30 journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="$id" | grep -E "$lines" | tail -n 20); fi
if [ -z "$j" ] && [ -n "$log" ] && [ -f "$log" ] && [ -r "$log" ]; then
    j=$(tail -c "$limit" "$log" | grep -E "$lines" | tail -n 1)
fi
if [ -n "$j" ]; then printf '%s\n' "$j"; fi
echo "${mark}ctr"
if [ -z "$j" ] && [ -S "$address" ] && command -v ctr >/dev/null 2>&1; then
    s=$(timeout 10 ctr --address "$address" plugins ls 2>/dev/null | grep -E '^io[.]containerd[.](grpc[.]v1 +cri|cri[.]v1) ')
    if [ -n "$s" ]; then printf '%s\n' "$s"; fi
    if [ -n "$s" ] && printf '%s\n' "$s" | grep -qv ' ok *$'; then
        timeout 10 ctr --address "$address" plugins ls -d id==cri 2>/dev/null | grep 'Message:'
    fi
fi
exit 0
