# shellcheck shell=sh
# Print `containerd config dump` of a candidate config tree, as config-dump.sh prints it: every *.toml
# under ROOT (read through symbolic links) copied into a new temporary directory, with the candidate
# CONFIG and DROPIN written there over their copies, each from a base64 line of stdin (CONFIG's first),
# dumped by the containerd first on PATH (BIN_DIR first, where not ""). STAGE in the candidates' text
# becomes the stage's path; the stage's path in containerd's messages becomes the node's own again, so
# its warnings compare with the node's. The stage is removed on exit; nothing is written outside it.
# Where the stage cannot be made the exit status line is `stage`; 124 where containerd did not answer
# within SECONDS. At most BYTES of the dump are printed, and 64 KiB of its stderr.
# Usage: sh -c "$script" gpunode-candidate-dump BIN_DIR ROOT CONFIG DROPIN STAGE SECONDS BYTES <CANDIDATES
# Exit status: 0 (non-zero only where no temporary directory could be made: nothing is printed then).
bin_dir=$1 root=$2 config=$3 dropin=$4 stage=$5 seconds=$6 bytes=$7
if [ -n "$bin_dir" ]; then
    PATH=$bin_dir:$PATH
    export PATH
fi
T=$(mktemp -d) || exit
trap 'rm -rf "$T"' EXIT
S="$T/stage"
mkdir "$S" || exit

# Write the base64 text $2 to the stage's copy of the path $1.
staged() {
    mkdir -p "$(dirname "$S$1")" && rm -f "$S$1" && printf %s "$2" | base64 -d | sed "s#$stage#$S#g" >"$S$1"
}

# Copy every *.toml under ROOT into the stage and write the candidates there (their text from stdin).
stage_candidate() {
    if ! { read -r c && read -r d; }; then
        echo "no candidate config on stdin" >&2
        return 1
    fi
    find -L "$root" -name "*.toml" -type f 2>/dev/null | while read -r f; do
        mkdir -p "$S$(dirname "$f")" && cat "$f" >"$S$f" || exit 1
    done || return 1
    staged "$config" "$c" && staged "$dropin" "$d"
}

# Print at most $1 bytes of the file $2, ending in a newline.
upto() {
    head -c "$1" "$2" >"$T/cut"
    cat "$T/cut"
    [ -z "$(tail -c 1 "$T/cut")" ] || echo
}

if stage_candidate 2>"$T/err"; then
    timeout "$seconds" containerd --config "$S$config" config dump >"$T/out" 2>"$T/err"
    rc=$?
    upto "$bytes" "$T/out"
else
    rc=stage
fi
echo "### gpunode-stderr"
sed "s#$S##g" "$T/err" >"$T/err.node"
upto 65536 "$T/err.node"
echo "### gpunode-rc $rc"
