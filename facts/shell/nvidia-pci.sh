# shellcheck shell=sh
# Print the node's NVIDIA PCI devices, each part after a line MARK<name>:
#   pci       one line a device of vendor 0x10de: ADDRESS CLASS DEVICE (e.g. 0000:1b:00.0 0x030200 0x2335)
#   nvswitch  the devices the nvidia-nvswitch driver lists, one a line (the part is empty without it)
# Usage: sh -c "$script" gpunode-nvidia-pci MARK
# Exit status: 0.
mark=$1
echo "${mark}pci"
for dev in /sys/bus/pci/devices/*; do
    v=
    # read, not cat: one process less for each device on the bus
    if [ -r "$dev/vendor" ] && read -r v <"$dev/vendor" && [ "$v" = 0x10de ]; then
        echo "${dev##*/} $(cat "$dev/class") $(cat "$dev/device")"
    fi
done
echo "${mark}nvswitch"
if [ -d /proc/driver/nvidia-nvswitch/devices ]; then ls /proc/driver/nvidia-nvswitch/devices; fi
exit 0
