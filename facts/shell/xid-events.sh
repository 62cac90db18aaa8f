# shellcheck shell=sh
# Print the NVIDIA Xid events of this boot from the kernel's log:
#   source=journal|dmesg  where they were read: the journal's kernel lines, else dmesg (nothing without either)
#   count=N               how many there are
#   then the last ten of them, a line each
# Usage: sh -c "$script" gpunode-xid-events
# Exit status: 0.
if command -v journalctl >/dev/null 2>&1 && [ -n "$(journalctl -k -b -n 1 --no-pager -q 2>/dev/null)" ]; then
    echo source=journal
    timeout 30 journalctl --no-pager -q -o short-iso-precise -k -b
elif dmesg >/dev/null 2>&1; then
    echo source=dmesg
    dmesg
fi | awk '
    /^source=/ { print; next }
    /NVRM: Xid/ { n++; last[n] = $0 }
    END {
        print "count=" n + 0
        for (i = (n > 10 ? n - 9 : 1); i <= n; i++) print last[i]
    }'
exit 0
