# shellcheck shell=sh
# Install packages (arguments: apt-get install's options, then name=version) whose install builds a kernel
# module with DKMS. Where apt fails, the last lines of each DKMS build log the install wrote follow apt's
# output on stderr, so that the failure names what broke the build.
# Usage: sh -c "$script" gpunode-install-built APT-GET-ARGUMENT...
# Exit status: apt-get's.
set -u
start=$(date +%s)
status=0
DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install "$@" || status=$?
if [ "$status" -ne 0 ]; then
    find /var/lib/dkms -name make.log -newermt "@$start" 2>/dev/null | head -n 4 | while read -r log; do
        echo "DKMS build log $(printf '%s' "$log" | tr -c 'A-Za-z0-9._+~/-' '?' | head -c 300), its last lines:" >&2
        tail -n 20 "$log" | cut -b 1-300 >&2
    done
fi
exit "$status"
