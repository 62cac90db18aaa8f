# shellcheck shell=sh
# Print `containerd config dump` of the config CONFIG (the containerd first on PATH), then its stderr
# after a line `### gpunode-stderr` and its exit status as a line `### gpunode-rc N`.
# Usage: sh -c "$script" gpunode-config-dump CONFIG
# Exit status: 0 (non-zero only where no temporary file could be made: nothing is printed then).
config=$1
err=$(mktemp) || exit
containerd --config "$config" config dump 2>"$err"
rc=$?
echo "### gpunode-stderr"
cat "$err"
echo "### gpunode-rc $rc"
rm -f "$err"
