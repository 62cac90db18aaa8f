# shellcheck shell=sh
# Print each CDI spec (*.yaml, *.json) of the directories given: a line `MARKER MTIME PATH`, then
# its text and an empty line; a file over LIMIT bytes is not read: `TOO_LARGE SIZE` instead of its text.
# Usage: sh -c "$script" gpunode-cdi-specs MARKER TOO_LARGE LIMIT DIR...
# Exit status: 0.
marker=$1 too_large=$2 limit=$3
shift 3
for dir in "$@"; do
    for spec in "$dir"/*.yaml "$dir"/*.json; do
        [ -f "$spec" ] || continue
        echo "$marker $(stat -c %Y "$spec") $spec"
        size=$(stat -c %s "$spec")
        if [ "$size" -gt "$limit" ]; then
            echo "$too_large $size"
        else
            head -c "$limit" "$spec"
            echo
        fi
    done
done
exit 0
