# shellcheck shell=sh
# Print the NVIDIA kernel module built for the running kernel, and for the kernel the node boots next,
# each part after a line MARK<name>:
#   kmod          the first nvidia*.ko* file under /lib/modules/RELEASE
#   kmod_version  its version as modinfo reads it: module nvidia, else nvidia-current (Debian's name)
#   boot_release  the release of the kernel the /vmlinuz (Debian) or /boot/vmlinuz (Ubuntu) link names
#   boot_kmod, boot_kmod_version  as kmod and kmod_version, for that release
# Usage: sh -c "$script" gpunode-built-module MARK
# Exit status: 0.
mark=$1
PATH=$PATH:/sbin:/usr/sbin
release=$(uname -r)
echo "${mark}kmod"
find /lib/modules/"$release" -name 'nvidia*.ko*' 2>/dev/null | head -n 1
echo "${mark}kmod_version"
modinfo -k "$release" -F version nvidia 2>/dev/null || modinfo -k "$release" -F version nvidia-current 2>/dev/null
boot=
for link in /vmlinuz /boot/vmlinuz; do
    if [ -L "$link" ]; then
        boot=$(readlink "$link" | head -c 300)
        boot=${boot##*/vmlinuz-}
        boot=${boot#vmlinuz-}
        break
    fi
done
case $boot in '' | *[!A-Za-z0-9._+~-]*) boot= ;; esac
echo "${mark}boot_release"
if [ -n "$boot" ]; then
    echo "$boot"
    echo "${mark}boot_kmod"
    find /lib/modules/"$boot" -name 'nvidia*.ko*' 2>/dev/null | head -n 1
    echo "${mark}boot_kmod_version"
    modinfo -k "$boot" -F version nvidia 2>/dev/null || modinfo -k "$boot" -F version nvidia-current 2>/dev/null
fi
exit 0
