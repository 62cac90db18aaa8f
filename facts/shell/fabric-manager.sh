# shellcheck shell=sh
# Print the node's Fabric Manager, each part after a line MARK<name>:
#   fm_packages  the installed nvidia-fabricmanager* and libnvidia-nscq* packages, in dpkg-query FORMAT
#   fm_unit      active=STATE and enabled=STATE of nvidia-fabricmanager.service (empty without systemctl)
# Usage: sh -c "$script" gpunode-fabric-manager MARK FORMAT
# Exit status: 0.
mark=$1 format=$2
echo "${mark}fm_packages"
dpkg-query -W -f="$format" 'nvidia-fabricmanager*' 'libnvidia-nscq*' 2>/dev/null | head -n 200 | cut -b 1-1000
echo "${mark}fm_unit"
if command -v systemctl >/dev/null 2>&1; then
    echo "active=$(systemctl is-active nvidia-fabricmanager.service 2>/dev/null)"
    echo "enabled=$(systemctl is-enabled nvidia-fabricmanager.service 2>/dev/null)"
fi
exit 0
