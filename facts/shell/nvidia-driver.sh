# shellcheck shell=sh
# Print the NVIDIA driver the node runs, each part after a line MARK<name>:
#   module           the loaded module's version (/sys/module/nvidia/version)
#   proc             /proc/driver/nvidia/version (the module's version and flavour)
#   library          every libnvidia-ml.so.1 of the loader's cache for this machine, resolved, first first
#   library_package  the package that owns the first of them (dpkg may know it without /usr)
#   smi              rc=N: nvidia-smi's exit status, asked only while the module is loaded (through
#                    nvidia-modprobe it would load it otherwise); rc=timeout where it did not answer within
#                    SECONDS (a wedged GPU: it may hang in the kernel, out of reach of a signal, so it is left
#                    behind, killed, with nothing of this program waiting on it)
#   persistenced     load=, active= and enabled= of nvidia-persistenced.service (empty without systemctl)
# Usage: sh -c "$script" gpunode-nvidia-driver MARK SECONDS
# Exit status: 0.
mark=$1 seconds=$2
PATH=$PATH:/sbin:/usr/sbin
echo "${mark}module"
if [ -r /sys/module/nvidia/version ]; then cat /sys/module/nvidia/version; fi
echo "${mark}proc"
if [ -r /proc/driver/nvidia/version ]; then cat /proc/driver/nvidia/version; fi
echo "${mark}library"
nvml=$(ldconfig -p 2>/dev/null | awk '$1 == "libnvidia-ml.so.1" && /x86-64|AArch64/ {print $NF}' |
    while read -r lib; do readlink -f "$lib"; done)
if [ -n "$nvml" ]; then echo "$nvml"; fi
echo "${mark}library_package"
first=$(echo "$nvml" | head -n 1)
if [ -n "$first" ] && command -v dpkg-query >/dev/null 2>&1; then
    dpkg-query -S "$first" "${first#/usr}" 2>/dev/null | head -n 1
fi
echo "${mark}smi"
if [ -d /sys/module/nvidia ] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=driver_version --format=csv,noheader >/dev/null 2>&1 </dev/null &
    pid=$!
    tenths=0
    while kill -0 "$pid" 2>/dev/null && [ "$tenths" -lt $((seconds * 10)) ]; do
        sleep 0.1
        tenths=$((tenths + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null
        echo "rc=timeout"
    else
        wait "$pid"
        echo "rc=$?"
    fi
fi
echo "${mark}persistenced"
if command -v systemctl >/dev/null 2>&1; then
    echo "load=$(systemctl show -p LoadState --value nvidia-persistenced.service 2>/dev/null | head -c 40)"
    echo "active=$(systemctl is-active nvidia-persistenced.service 2>/dev/null | head -c 40)"
    echo "enabled=$(systemctl is-enabled nvidia-persistenced.service 2>/dev/null | head -c 40)"
fi
exit 0
