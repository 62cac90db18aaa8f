#!/usr/bin/env bash
# Run every test: lint, format and type checks (scripts/lint.sh), unit and fixture tests, the
# real-containerd matrix, the chroot tests and the test-fleet integration tests. Needs root
# (namespaces, chroot, systemd-nspawn).
#
# Usage: scripts/test.sh [--fast] [PYTEST ARGUMENTS...]
#   --fast   only the tests that boot no test host: unit, fixture, real-binary and chroot tests
# Without arguments the suite runs as three pytest processes side by side (tests/conftest.py's
# shards: the shared fleets' tests, the module fleets' tests, and everything that boots no host),
# each logging to a file that is printed when all are done; with arguments, as one process.
set -euo pipefail
cd "$(dirname "$0")/.."
selection=()
if [ "${1:-}" = --fast ]; then
    shift
    selection=(-m "not fleet and not vm")
fi
bash scripts/setup.sh
bash scripts/lint.sh
if [ "${#selection[@]}" -gt 0 ] || [ "$#" -gt 0 ]; then
    exec .venv/bin/pytest "${selection[@]}" "$@"
fi

shards=(session modules fast)
logs=$(mktemp -d /tmp/gpunode-tests.XXXXXX)
pids=()
# Job control: each shard in a process group of its own, so that an interrupt reaches the shards once, from
# the trap below; a shard takes SIGINT although started as a background job (tests/conftest.py) and
# tears its fleets and mounts down.
set -m
for shard in "${shards[@]}"; do
    .venv/bin/pytest --shard "$shard" -p no:cacheprovider --basetemp "$logs/$shard" --durations=10 \
        >"$logs/$shard.log" 2>&1 &
    pids+=("$!")
    echo "shard $shard: pytest $! (log $logs/$shard.log)"
done
trap 'kill -INT "${pids[@]}" 2>/dev/null' INT TERM
failed=()
for i in "${!shards[@]}"; do
    wait "${pids[$i]}" || failed+=("${shards[$i]}")
done
for shard in "${shards[@]}"; do
    echo "=================================== shard $shard ==================================="
    cat "$logs/$shard.log"
done
for shard in "${shards[@]}"; do
    echo "shard $shard: $(tail -n 1 "$logs/$shard.log")"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed shards: ${failed[*]} (logs in $logs)"
    exit 1
fi
rm -rf --one-file-system "$logs"
