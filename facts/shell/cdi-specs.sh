# shellcheck shell=sh
# Print each CDI spec (*.yaml, *.json) of the directories given: a line `MARKER MTIME PATH`, then
# its text and an empty line; a file over LIMIT bytes is not read: `TOO_LARGE SIZE` instead of its text; a
# file (or name) that is not UTF-8 is not printed either (the controller reads the output as UTF-8, and a
# byte it cannot decode would cut off the rest): `NOT_UTF8` instead, its name with such bytes left out.
# Usage: sh -c "$script" gpunode-cdi-specs MARKER TOO_LARGE LIMIT NOT_UTF8 DIR...
# Exit status: 0.
marker=$1 too_large=$2 limit=$3 not_utf8=$4
shift 4

# Whether stdin is UTF-8 text (without iconv on the node, taken to be).
utf8() {
    ! command -v iconv >/dev/null 2>&1 || iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1
}

for dir in "$@"; do
    for spec in "$dir"/*.yaml "$dir"/*.json; do
        [ -f "$spec" ] || continue
        case $spec in *"
"*) continue ;; esac # a name with a newline would forge a line of the output
        if ! printf %s "$spec" | utf8; then
            echo "$marker $(stat -c %Y "$spec") $(printf %s "$spec" | iconv -c -f UTF-8 -t UTF-8 2>/dev/null)"
            echo "$not_utf8"
            continue
        fi
        echo "$marker $(stat -c %Y "$spec") $spec"
        size=$(stat -c %s "$spec")
        if [ "$size" -gt "$limit" ]; then
            echo "$too_large $size"
        elif ! utf8 <"$spec"; then
            echo "$not_utf8"
        else
            # No line of a spec may pass for a marker of this read (valid YAML and JSON never start one with @).
            head -c "$limit" "$spec" | sed 's/^@@/@ @/'
            echo
        fi
    done
done
exit 0
