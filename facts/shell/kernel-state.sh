# shellcheck shell=sh
# Print the node's kernels, each part after a line MARK<name>:
#   running   the running kernel's release
#   packages  the installed linux-* packages, in dpkg-query FORMAT (the first 4000 lines, each cut at 1000 bytes)
#   boot      the targets of the /vmlinuz and /boot/vmlinuz links (the kernel the next boot starts)
#   nouveau   "loaded" while the nouveau module is
# Usage: sh -c "$script" gpunode-kernel-state MARK FORMAT
# Exit status: 0.
mark=$1 format=$2
echo "${mark}running"
uname -r
echo "${mark}packages"
dpkg-query -W -f="$format" 'linux-*' 2>/dev/null | head -n 4000 | cut -b 1-1000
echo "${mark}boot"
for link in /vmlinuz /boot/vmlinuz; do
    if [ -L "$link" ]; then readlink "$link"; fi
done
echo "${mark}nouveau"
if [ -d /sys/module/nouveau ]; then echo loaded; fi
exit 0
