# shellcheck shell=sh
# Release the node lock LOCK if HOLDER holds it: end the holder process node-lock.sh started (the
# second line of LOCK), and only that one: LOCK must be a regular file of root's (not a link), and the
# process must be root's and run node-lock.sh's holder program for this LOCK and HOLDER, so no pid
# that another user wrote, and no other process that now has that pid, is ever signalled.
# Usage: sh -c "$script" gpunode-lock LOCK HOLDER
# Exit status: always 0.
lock=$1
holder=$2
if [ -f "$lock" ] && ! [ -L "$lock" ] && [ "$(stat -c %u "$lock")" = 0 ] && [ "$(head -n 1 "$lock")" = "$holder" ]; then
    pid=$(sed -n 2p "$lock")
    case $pid in '' | *[!0-9]*) pid= ;; esac
    if [ -n "$pid" ] && [ "$(stat -c %u "/proc/$pid" 2>/dev/null)" = 0 ] &&
        [ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | sed -n 4,6p)" = "$(printf 'gpunode-lock\n%s\n%s' "$lock" "$holder")" ]; then
        kill "$pid" 2>/dev/null
    fi
fi
true
