# shellcheck shell=sh
# Print the NVIDIA kernel module built for the running kernel, each part after a line MARK<name>:
#   kmod          the first nvidia*.ko* file under /lib/modules/RELEASE
#   kmod_version  its version as modinfo reads it: module nvidia, else nvidia-current (Debian's name)
# Usage: sh -c "$script" gpunode-built-module MARK
# Exit status: 0.
mark=$1
PATH=$PATH:/sbin:/usr/sbin
release=$(uname -r)
echo "${mark}kmod"
find /lib/modules/"$release" -name 'nvidia*.ko*' 2>/dev/null | head -n 1
echo "${mark}kmod_version"
modinfo -k "$release" -F version nvidia 2>/dev/null || modinfo -k "$release" -F version nvidia-current 2>/dev/null
exit 0
