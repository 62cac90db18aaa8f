# shellcheck shell=sh
# Print NVML's answer, the last line of python3 SNIPPET's output (one JSON object), where the node has an
# NVIDIA PCI device and python3; where it does not answer within SECONDS (a wedged GPU or driver: NVML may hang
# in the kernel, out of reach of a signal), the object with the error "Timeout" instead, the process left
# behind, killed, with nothing of this program waiting on it.
# Usage: sh -c "$script" gpunode-nvml SECONDS SNIPPET
# Exit status: 0.
seconds=$1 snippet=$2
grep -qsx 0x10de /sys/bus/pci/devices/*/vendor && command -v python3 >/dev/null 2>&1 || exit 0
out=$(mktemp) || exit 0
python3 -B -c "$snippet" >"$out" 2>/dev/null </dev/null &
pid=$!
tenths=0
while kill -0 "$pid" 2>/dev/null && [ "$tenths" -lt $((seconds * 10)) ]; do
    sleep 0.1
    tenths=$((tenths + 1))
done
if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
    echo '{"driver_version": null, "nvml_version": null, "cuda_driver_version": null, "devices": [], "error": "Timeout"}'
else
    wait "$pid"
    cat "$out"
fi
rm -f "$out"
exit 0
