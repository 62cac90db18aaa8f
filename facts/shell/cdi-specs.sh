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
        case $spec in *"
"*) continue ;; esac # a name with a newline would forge a line of the output
        echo "$marker $(stat -c %Y "$spec") $spec"
        size=$(stat -c %s "$spec")
        if [ "$size" -gt "$limit" ]; then
            echo "$too_large $size"
        else
            # No line of a spec may pass for a marker of this read (valid YAML and JSON never start one with @).
            head -c "$limit" "$spec" | sed 's/^@@/@ @/'
            echo
        fi
    done
done
exit 0
