# shellcheck shell=sh
# Print where the toolkit's CDI refresh units are installed (`unit PATH` for each unit file found in
# the unit directories given), then `dropin` and the text of DROPIN when that file exists.
# Usage: sh -c "$script" gpunode-cdi-refresh-units DROPIN UNITDIR...
# Exit status: 0.
dropin=$1
shift
for dir in "$@"; do
    for unit in nvidia-cdi-refresh.service nvidia-cdi-refresh.path; do
        if [ -f "$dir/$unit" ]; then echo "unit $dir/$unit"; fi
    done
done
if [ -f "$dropin" ]; then
    echo dropin
    head -c 65536 "$dropin" | sed 's/^@@/@ @/' # no line passes for a marker of a composite read
fi
exit 0
