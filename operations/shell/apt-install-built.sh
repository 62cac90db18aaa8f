# shellcheck shell=sh
# Install a driver's packages (arguments after the versions: apt-get install's options, then name=version)
# whose install builds a kernel module with DKMS, replacing the driver of version OLD where one is installed:
# OLD's packages stay installed until the new ones are installed and built, then those apt no longer needs are
# removed. Where apt fails, the last lines of each DKMS build log the install wrote follow apt's output on
# stderr, and the node is put back as it was: the new version's packages removed and the previous driver's
# packages at their versions (from apt's cache: a package the install replaced is downgraded to the file kept
# there), held again; the last line says whether that worked.
# With --restore, the same putting back after an install that succeeded (its module did not load after the
# reboot): driver NEW's packages removed, OLD's at the versions PIN... (name=version) installed from apt's cache
# and held.
# Usage: sh -c "$script" gpunode-install-built OLD NEW APT-GET-ARGUMENT...   (OLD "": no driver to replace)
#        sh -c "$script" gpunode-install-built --restore OLD NEW PIN...
# Exit status: apt-get's (--restore: 0 where the previous driver is back).
set -u
restore=
[ "$1" != --restore ] || { restore=1 && shift; }
old=$1 new=$2
shift 2
export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1

# of_version V [FORMAT]: the driver packages on the node (installed, or left unpacked or half-configured by a
# failed install) whose version's upstream part is V
of_version() {
    dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' '*nvidia*' 'libcuda*' 2>/dev/null |
        awk -v v="$1" -v pins="${2:-}" '$1 ~ /^.[iUFHWt]/ {
            u = $3; sub(/^[0-9]+:/, "", u); sub(/-[^-]*$/, "", u)
            if (u == v) { if (pins) print $2 "=" $3; else print $2 }
        }'
}

# removable NAME...: those of NAMES apt would remove as no longer needed by what depends on them (a
# suggestion or recommendation keeps none: glx-alternative-nvidia suggests nvidia-driver)
removable() {
    apt-get -s -o APT::AutoRemove::SuggestsImportant=false -o APT::AutoRemove::RecommendsImportant=false \
        autoremove 2>/dev/null | awk '/^Remv / {print $2}' | grep -Fx "$(printf '%s\n' "$@")"
}

# retired V: driver V's packages but those named in $wanted (a package the new driver keeps at its installed
# version, nvidia-persistenced, may have the old driver's version)
retired() {
    of_version "$1" | grep -vFx "$wanted"
}

# retire OLD: remove its packages that nothing else needs (a package both drivers provide may satisfy a
# dependency with the old one's: those go one by one where removing them takes nothing else with them)
retire() {
    for _ in 1 2 3; do
        # shellcheck disable=SC2046
        gone=$(removable $(retired "$1"))
        [ -n "$gone" ] || break
        # shellcheck disable=SC2086
        apt-get remove -y --allow-change-held-packages $gone || return
    done
    for name in $(retired "$1"); do
        with=$(apt-get -s remove "$name" 2>/dev/null | awk '/^Remv / {print $2}' | grep -vFx "$(of_version "$1")")
        [ -n "$with" ] || apt-get remove -y --allow-change-held-packages "$name" || return
    done
}

# installed: the driver packages installed now, by name
installed() {
    dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' '*nvidia*' 'libcuda*' 2>/dev/null | awk '$1 ~ /^.i/ {print $2}'
}

# put_back: the previous driver's packages ($previous) at their versions, the new version's the install brought
# (installed neither before it, $before, nor among $previous) removed, the previous ones held again; the last
# line on stderr says what the node has now. Exit status: 0 where that worked.
put_back() {
    names=$(printf '%s\n' "$previous" | sed 's/=.*//')
    brought=$(of_version "$new" | grep -vFx "$names" | grep -vFx "$before")
    removals=
    for name in $brought; do removals="$removals $name-"; done
    # shellcheck disable=SC2086
    if ! apt-get install -y --no-install-recommends --allow-downgrades --allow-change-held-packages --no-download \
        $previous $removals >&2; then
        echo "$1, and putting driver ${old:-none} back failed too (see above)" >&2
        return 1
    fi
    wanted=$names
    retire "$new" >&2
    if [ -n "$previous" ]; then
        # shellcheck disable=SC2086
        apt-mark hold $names >/dev/null
        echo "$1: driver $old is back, its packages held again" >&2
    else
        echo "$1: its packages are removed again" >&2
    fi
}

# the packages the install names (name=version or name; apt's options left out)
wanted=$(printf '%s\n' "$@" | sed -n '/^[a-z0-9]/s/=.*//p')
before=
if [ -n "$restore" ]; then
    previous=$(printf '%s\n' "$@")
    put_back "driver $new did not load"
    exit
fi
previous=
before=$(installed)
if [ -n "$old" ]; then
    previous=$(of_version "$old" pins)
    # apt removes no held package and no package marked as installed by hand as no longer needed
    # shellcheck disable=SC2046 # one word per package
    [ -z "$previous" ] || { apt-mark unhold $(of_version "$old") && apt-mark auto $(of_version "$old"); } >/dev/null
fi
start=$(date +%s)
status=0
apt-get install "$@" || status=$?
if [ "$status" -eq 0 ]; then
    if [ -n "$previous" ]; then
        retire "$old" || status=$?
    fi
    exit "$status"
fi
find /var/lib/dkms -name make.log -newermt "@$start" 2>/dev/null | head -n 4 | while read -r log; do
    echo "DKMS build log $(printf '%s' "$log" | tr -c 'A-Za-z0-9._+~/-' '?' | head -c 300), its last lines:" >&2
    tail -n 20 "$log" | cut -b 1-300 | tr -d '\000-\010\013-\037\177' >&2
done
put_back "the install of driver $new failed"
exit "$status"
