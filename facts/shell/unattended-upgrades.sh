# shellcheck shell=sh
# Print what may upgrade packages or restart services behind the deploy's back, each part after a
# line MARK<name>:
#   packages          unattended-upgrades and needrestart, where installed, in dpkg-query FORMAT
#   dump              apt's APT::Periodic and Unattended-Upgrade::Package-Blacklist settings
#   units             UNIT=STATE for each UNIT given: systemctl is-enabled's word
#   needrestart       needrestart's restart mode and override lines from its config files
#   apt_conf          the text of APT_CONF, this library's apt setting (absent without it)
#   needrestart_conf  last: the text of NEEDRESTART_CONF, its needrestart setting (absent without it)
# Usage: sh -c "$script" gpunode-unattended-upgrades MARK FORMAT APT_CONF NEEDRESTART_CONF UNIT...
# Exit status: 0.
mark=$1 format=$2 apt_conf=$3 needrestart_conf=$4
shift 4
echo "${mark}packages"
dpkg-query -W -f="$format" unattended-upgrades needrestart 2>/dev/null
echo "${mark}dump"
apt-config dump 2>/dev/null | grep -E '^(APT::Periodic|Unattended-Upgrade::Package-Blacklist)'
echo "${mark}units"
for unit in "$@"; do
    printf '%s=%s\n' "$unit" "$(systemctl is-enabled "$unit" 2>/dev/null)"
done
echo "${mark}needrestart"
for f in /etc/needrestart/needrestart.conf /etc/needrestart/conf.d/*.conf; do
    if [ -f "$f" ]; then
        grep -hE '^[[:space:]]*([$]nrconf[{](restart|override_rc)[}]|qr[(].*[)][[:space:]]*=>)' "$f"
    fi
done
if [ -f "$apt_conf" ]; then
    echo "${mark}apt_conf"
    cat "$apt_conf"
fi
if [ -f "$needrestart_conf" ]; then
    echo "${mark}needrestart_conf"
    cat "$needrestart_conf"
fi
exit 0
