# shellcheck shell=sh
# Print a platform's own containerd config files and processes (k3s, RKE2, k0s), each part after a line
# MARK<name>:
#   files      for CONFIG and each DROPINS/*.toml, a regular readable file: a line
#              BITS B64PATH B64TEXT (permission bits in octal; path and at most LIMIT bytes of text in base64)
#   processes  every containerd process: a line PID UNIT, the systemd unit whose cgroup it runs in
#              (cgroup v2, or v1's name=systemd line; empty where none)
#   links      each symbolic link among DROPINS and the directories above it: a line B64PATH B64TARGET
# Usage: sh -c "$script" gpunode-platform-containerd MARK CONFIG DROPINS LIMIT
# Exit status: 0.
mark=$1 config=$2 dropins=$3 limit=$4
echo "${mark}files"
for f in "$config" "$dropins"/*.toml; do
    if [ -f "$f" ] && [ -r "$f" ]; then
        echo "$(stat -L -c %a "$f") $(printf %s "$f" | base64 -w0) $(head -c "$limit" "$f" | base64 -w0)"
    fi
done
echo "${mark}processes"
for p in $(pgrep -x containerd 2>/dev/null); do
    # A short-lived `containerd config dump|default|migrate` (another run's read, an operator's) is no daemon.
    case " $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in *" config "*) continue ;; esac
    echo "$p $(awk -F: '$3 != "/" && ($2 == "" || $2 == "name=systemd") {n = split($3, a, "/"); print a[n]; exit}' \
        "/proc/$p/cgroup" 2>/dev/null)"
done
echo "${mark}links"
d=
for part in $(printf %s "$dropins" | tr '/' ' '); do
    d="$d/$part"
    if [ -L "$d" ]; then
        echo "$(printf %s "$d" | base64 -w0) $(printf %s "$(readlink "$d" | head -c 4096)" | base64 -w0)"
    fi
done
exit 0
