# shellcheck shell=sh
# Print what keeps nouveau off the node, each part after a line MARK<name>:
#   nouveau    "loaded" while the nouveau module is
#   nova_core  "shipped" where an installed kernel ships the nova_core module (Linux 6.15 and later,
#              drivers/gpu/nova-core: it claims GSP GPUs, Turing and later, as nouveau would), "loaded"
#              while it is
#   initramfs  the text of STAMP, the note of the initramfs rebuilt with the blacklist (absent without it)
#   content    the text of BLACKLIST, the modprobe file (absent without it)
# Usage: sh -c "$script" gpunode-nouveau-blacklist MARK BLACKLIST STAMP
# Exit status: 0.
mark=$1 blacklist=$2 stamp=$3
echo "${mark}nouveau"
if [ -d /sys/module/nouveau ]; then echo loaded; fi
echo "${mark}nova_core"
if [ -n "$(find /lib/modules -mindepth 2 -maxdepth 6 -path '*/drivers/gpu/nova-core/nova_core.ko*' 2>/dev/null | head -n 1)" ]; then
    echo shipped
fi
if [ -d /sys/module/nova_core ]; then echo loaded; fi
if [ -f "$stamp" ]; then
    echo "${mark}initramfs"
    cat "$stamp"
fi
if [ -f "$blacklist" ]; then
    echo "${mark}content"
    cat "$blacklist"
fi
exit 0
