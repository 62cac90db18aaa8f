# shellcheck shell=sh
# Print the state of the systemd unit UNIT that runs containerd, as KEY=VALUE lines: systemctl show's
# properties, then
#   Processes=PID:UNIT ...  every containerd daemon process and the unit whose cgroup it runs in (cgroup
#                           v2, or v1's name=systemd line; empty where none); a `containerd config ...`
#                           command is none
#   ConfigMtime=EPOCH       the newest mtime in the config tree: every file under each PATH (through
#                           links) and every link itself, except the file SKIP ("": none)
# Usage: sh -c "$script" gpunode-containerd-service UNIT SKIP PATH...
# Exit status: 0.
unit=$1 skip=$2
shift 2
systemctl show "$unit" --timestamp=us+utc -p LoadState -p TriggeredBy -p ActiveState -p SubState \
    -p MainPID -p Result -p Restart -p RestartUSec -p NRestarts -p ExecMainStartTimestamp -p InvocationID
processes=
for p in $(pgrep -x containerd 2>/dev/null); do
    # A short-lived `containerd config dump|default|migrate` (another run's read, an operator's) is no daemon.
    case " $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in *" config "*) continue ;; esac
    in=$(awk -F: '$3 != "/" && ($2 == "" || $2 == "name=systemd") {n = split($3, a, "/"); print a[n]; exit}' \
        "/proc/$p/cgroup" 2>/dev/null)
    processes="$processes${processes:+ }$p:$in"
done
echo "Processes=$processes"
mtime=$({
    find -L "$@" -type f ! -path "$skip" -printf '%T@\n'
    find "$@" -type l ! -path "$skip" -printf '%T@\n'
} 2>/dev/null | sort -n | tail -n 1)
echo "ConfigMtime=$mtime"
exit 0
