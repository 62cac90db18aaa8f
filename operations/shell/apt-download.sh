# shellcheck shell=sh
# Download packages (arguments: name=version or name) and what they depend on into apt's cache,
# installing nothing. On failure the last line on stderr is apt's first error, for the run's summary.
# Usage: sh -c "$script" gpunode-download PACKAGE...
set -u
errors=$(mktemp) || exit 1
trap 'rm -f "$errors"' EXIT
status=0
DEBIAN_FRONTEND=noninteractive apt-get install --download-only -y --no-install-recommends \
    --allow-change-held-packages "$@" 2>"$errors" || status=$?
cat "$errors" >&2
if [ "$status" -ne 0 ]; then
    first=$(grep -m 1 '^E: ' "$errors" || true)
    echo "packages not downloaded: ${first:-apt-get exited $status}" >&2
fi
exit "$status"
