# shellcheck shell=sh
# Print how the node booted, after a line MARK"secureboot", as one line:
#   bios                 no EFI
#   efivar N             the SecureBoot EFI variable's value byte (1 on, 0 off), read from VAR
#   mokutil TEXT         mokutil --sb-state's first line, where the variable cannot be read
#   unknown              neither
# Usage: sh -c "$script" gpunode-secure-boot MARK VAR
# Exit status: 0.
mark=$1 var=$2
echo "${mark}secureboot"
if [ ! -d /sys/firmware/efi ]; then
    echo bios
elif [ -r "$var" ]; then
    echo "efivar $(od -An -t u1 -j 4 -N 1 "$var")"
elif command -v mokutil >/dev/null 2>&1; then
    echo "mokutil $(mokutil --sb-state 2>&1 | head -n 1)"
else
    echo unknown
fi
exit 0
