# shellcheck shell=sh
# Take the node lock LOCK for HOLDER: a background process holds it (flock; the file's first line
# names the holder, the second is that process) for as long as this connection lives (the nearest
# ancestor that is not a shell, sudo or chroot: sshd's session, or pyinfra itself for
# @chroot/@local) or until node-unlock.sh ends it, waiting up to 10 s for a run that just ended.
# Usage: sh -c "$script" gpunode-lock LOCK HOLDER
# Exit status: 0 when HOLDER holds the lock; 1, naming the holder on stderr, when another run holds it.
lock=$1
holder=$2
mkdir -p "$(dirname "$lock")" && p=$PPID
while c=$(cat "/proc/$p/comm" 2>/dev/null); do
    case "$c" in
    sh | bash | dash | sudo | su | doas | chroot | env | timeout) p=$(cut -d' ' -f4 "/proc/$p/stat") ;;
    *) break ;;
    esac
done
# The holder: LOCK open on fd 9 (closed for each sleep) while the connection's process $3 lives.
# shellcheck disable=SC2016
sh -c 'exec 9<>"$1" && flock -w 10 9 && printf "%s\n%s\n" "$2" "$$" > "$1" && while kill -0 "$3" 2>/dev/null; do sleep 1 9>&-; done' gpunode-lock "$lock" "$holder" "$p" </dev/null >/dev/null 2>&1 &
w=$!
i=0
while [ "$i" -lt 1500 ]; do
    [ "$(head -n 1 "$lock" 2>/dev/null)" = "$holder" ] && exit 0
    kill -0 "$w" 2>/dev/null || break
    sleep 0.01
    i=$((i + 1))
done
echo "another run holds the node lock $lock: $(head -n 1 "$lock" 2>/dev/null)" >&2
exit 1
