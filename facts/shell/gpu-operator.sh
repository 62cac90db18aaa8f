# shellcheck shell=sh
# Print what the GPU Operator left on the node, each part after a line MARK<name>:
#   toolkit      the executables in its toolkit directory, one name a line
#   driver_root  the versioned libnvidia-ml.so.* regular files (no links followed) in its driver root
#   validations  the validator's marker files, one name a line (the part is absent without the directory)
#   driver_ready the driver-ready marker's KEY=VALUE lines (at most LIMIT bytes)
#   dropin       last: the toolkit's containerd drop-in's text (at most LIMIT bytes), when it is a file
# The text read from files has no line starting with @@ (no TOML or KEY=VALUE line does), so it
# cannot start a part of this or an enclosing fact's output.
# Usage: sh -c "$script" gpunode-gpu-operator MARK TOOLKIT_DIR DRIVER_ROOT VALIDATIONS_DIR DROPIN LIMIT
# Exit status: 0.
mark=$1 toolkit=$2 root=$3 validations=$4 dropin=$5 limit=$6
echo "${mark}toolkit"
for f in "$toolkit"/*; do
    if [ -f "$f" ] && [ -x "$f" ]; then echo "${f##*/}"; fi
done
echo "${mark}driver_root"
for dir in usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib64 lib64 usr/lib; do
    for f in "$root/$dir"/libnvidia-ml.so.[0-9]*; do
        if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f"; fi
    done
done
if [ -d "$validations" ]; then
    echo "${mark}validations"
    for f in "$validations"/* "$validations"/.driver-ctr-ready; do
        if [ -e "$f" ]; then echo "${f##*/}"; fi
    done
    echo "${mark}driver_ready"
    if [ -f "$validations/driver-ready" ]; then head -c "$limit" "$validations/driver-ready" | grep -v '^@@'; fi
fi
if [ -f "$dropin" ]; then
    echo "${mark}dropin"
    head -c "$limit" "$dropin" | grep -v '^@@'
fi
exit 0
