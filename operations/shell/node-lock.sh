# shellcheck shell=sh
# Take (or renew) the node lock LOCK for HOLDER: a background process holds it (flock; the file's
# first line names the holder, the second is that process) for as long as this connection lives (the
# nearest ancestor that is not a shell, sudo or chroot: sshd's session, or pyinfra itself for
# @chroot/@local) and at most HOLD seconds after the lock was last taken or renewed, or until
# node-unlock.sh ends it, waiting up to 10 s for a run that just ended. When HOLDER's own holder
# still holds LOCK, renew it (the file's time) instead. The node's login shell is one of the shells
# passed over (sshd runs the command through it, and fish or zsh end once the command has).
# LOCK lives in a directory of its own that must be root's and writable by no one else (it is made
# 0700 if missing; one that is a link, not a directory, another user's or group/world-writable is
# refused): no other user can plant, replace or open anything in it, so LOCK is checked by path
# there (a link or anything but a regular file of root's without group/other access is refused).
# Usage: sh -c "$script" gpunode-lock LOCK HOLDER HOLD
# Exit status: 0 when HOLDER holds the lock; 1, naming the holder on stderr, when another run holds
# it; 2, naming it, when the directory or LOCK is refused.
lock=$1
holder=$2
hold=$3
dir=${lock%/*}
umask 077
[ -e "$dir" ] || [ -L "$dir" ] || mkdir "$dir" 2>/dev/null
if [ -L "$dir" ]; then
    echo "node lock directory $dir is a symbolic link: refusing it" >&2
    exit 2
fi
if ! [ -d "$dir" ]; then
    echo "node lock directory $dir is not a directory ($(stat -c %F "$dir" 2>/dev/null || echo missing)): refusing it" >&2
    exit 2
fi
owner=$(stat -c %u "$dir") && mode=$(stat -c %a "$dir") || exit 2
if [ "$owner" != 0 ] || [ $((0$mode & 022)) != 0 ]; then
    echo "node lock directory $dir is owned by uid $owner with mode $mode: it must be root's and writable by no one else; refusing it" >&2
    exit 2
fi
if [ -L "$lock" ]; then
    echo "node lock $lock is a symbolic link: refusing it" >&2
    exit 2
fi
if [ -e "$lock" ]; then
    if ! [ -f "$lock" ]; then
        echo "node lock $lock is not a regular file ($(stat -c %F "$lock")): refusing it" >&2
        exit 2
    fi
    owner=$(stat -c %u "$lock") && mode=$(stat -c %a "$lock") || exit 2
    if [ "$owner" != 0 ] || [ $((0$mode & 077)) != 0 ]; then
        echo "node lock $lock is owned by uid $owner with mode $mode: it must be root's and open to no one else; refusing it" >&2
        exit 2
    fi
    # Renew: HOLDER's holder (a root process running the holder program for LOCK and HOLDER) is alive.
    pid=$(sed -n 2p "$lock")
    case $pid in '' | *[!0-9]*) pid= ;; esac
    if [ -n "$pid" ] && [ "$(head -n 1 "$lock")" = "$holder" ] && [ "$(stat -c %u "/proc/$pid" 2>/dev/null)" = 0 ] &&
        [ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | sed -n 4,6p)" = "$(printf 'gpunode-lock\n%s\n%s' "$lock" "$holder")" ]; then
        touch "$lock" && exit 0
    fi
fi
p=$PPID
while c=$(cat "/proc/$p/comm" 2>/dev/null); do
    case "$c" in
    sh | bash | dash | zsh | fish | ksh | ksh93 | mksh | lksh | ash | busybox | yash | posh | tcsh | csh | \
        sudo | su | doas | chroot | env | timeout) p=$(cut -d' ' -f4 "/proc/$p/stat") ;;
    *) break ;;
    esac
done
# The holder: LOCK open on fd 9 (closed for each sleep) while the connection's process $3 lives and
# LOCK was taken or renewed (its modification time) less than $4 seconds ago.
# shellcheck disable=SC2016
sh -c 'exec 9<>"$1" && flock -w 10 9 && printf "%s\n%s\n" "$2" "$$" >"$1" && while kill -0 "$3" 2>/dev/null && [ $(($(date +%s 9>&-) - $(stat -c %Y "$1" 9>&-))) -lt "$4" ]; do sleep 1 9>&-; done' gpunode-lock "$lock" "$holder" "$p" "$hold" </dev/null >/dev/null 2>&1 &
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
