# shellcheck shell=sh
# Print the NVIDIA kernel module built for the running kernel, and for the kernel the node boots next,
# each part after a line MARK<name>:
#   kmod          the first nvidia*.ko* file under /lib/modules/RELEASE
#   kmod_version  its version as modinfo reads it: the module `modprobe nvidia` loads (Debian names it in
#                 an install line: nvidia-current, nvidia-tesla-535), else nvidia, else nvidia-current
#   kmod_vermagic its vermagic (the kernel release it was built for, then its options)
#   kmod_signer   who signed it and the key's id (modinfo's signer and sig_key), nothing where unsigned
#   boot_release  the release of the kernel the /vmlinuz (Debian) or /boot/vmlinuz (Ubuntu) link names
#   boot_kmod, boot_kmod_version, boot_kmod_vermagic, boot_kmod_signer  as above, for that release
# Usage: sh -c "$script" gpunode-built-module MARK
# Exit status: 0.
mark=$1
PATH=$PATH:/sbin:/usr/sbin

# built PREFIX RELEASE: the parts above for the module of kernel RELEASE
built() {
    echo "${mark}$1kmod"
    find /lib/modules/"$2" -name 'nvidia*.ko*' 2>/dev/null | head -n 1
    # the module `modprobe nvidia` loads: Debian names it in an install line its alternatives choose
    # (nvidia-current, nvidia-tesla-535), else nvidia, else nvidia-current
    module=$(cat /etc/modprobe.d/*.conf 2>/dev/null | head -c 100000 |
        awk '$1 == "install" && $2 == "nvidia" { for (i = 3; i < NF; i++) if ($i == "-i") { print $(i + 1); exit } }')
    case $module in nvidia-*) case $module in *[!A-Za-z0-9_-]*) module= ;; esac ;; *) module= ;; esac
    if [ -z "$module" ]; then
        module=nvidia
        modinfo -k "$2" -F version nvidia >/dev/null 2>&1 || module=nvidia-current
    fi
    echo "${mark}$1kmod_version"
    modinfo -k "$2" -F version "$module" 2>/dev/null | head -n 1
    echo "${mark}$1kmod_vermagic"
    modinfo -k "$2" -F vermagic "$module" 2>/dev/null | head -n 1
    echo "${mark}$1kmod_signer"
    signer=$(modinfo -k "$2" -F signer "$module" 2>/dev/null | head -n 1)
    [ -z "$signer" ] || echo "$signer ($(modinfo -k "$2" -F sig_key "$module" 2>/dev/null | head -n 1))"
}

built "" "$(uname -r)"
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
    built boot_ "$boot"
fi
exit 0
