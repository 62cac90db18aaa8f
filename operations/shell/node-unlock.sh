# shellcheck shell=sh
# Release the node lock LOCK if HOLDER holds it: end the holder process node-lock.sh started (the
# second line of LOCK), and only that one.
# Usage: sh -c "$script" gpunode-lock LOCK HOLDER
# Exit status: always 0.
lock=$1
holder=$2
if [ "$(head -n 1 "$lock" 2>/dev/null)" = "$holder" ]; then kill "$(sed -n 2p "$lock")" 2>/dev/null; fi
true
