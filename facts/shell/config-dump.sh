# shellcheck shell=sh
# Print `containerd config dump` of the config CONFIG (the containerd first on PATH), at most BYTES of
# it, then its stderr (at most 64 KiB) after a line `### gpunode-stderr` and its exit status as a line
# `### gpunode-rc N`: 124 where it did not answer within SECONDS.
# Usage: sh -c "$script" gpunode-config-dump CONFIG SECONDS BYTES
# Exit status: 0 (non-zero only where no temporary directory could be made: nothing is printed then).
config=$1 seconds=$2 bytes=$3
T=$(mktemp -d) || exit
trap 'rm -rf "$T"' EXIT

# Print at most $1 bytes of the file $2, ending in a newline.
upto() {
    head -c "$1" "$2" >"$T/cut"
    cat "$T/cut"
    [ -z "$(tail -c 1 "$T/cut")" ] || echo
}

timeout "$seconds" containerd --config "$config" config dump >"$T/out" 2>"$T/err"
rc=$?
upto "$bytes" "$T/out"
echo "### gpunode-stderr"
upto 65536 "$T/err"
echo "### gpunode-rc $rc"
