#!/usr/bin/env bash
# Run every test: lint, format and type checks (scripts/lint.sh), unit and fixture tests, the
# real-containerd matrix, the chroot tests and the test-fleet integration tests. Needs root
# (namespaces, chroot, systemd-nspawn).
#
# Usage: scripts/test.sh [--fast] [PYTEST ARGUMENTS...]
#   --fast   only the tests that boot no test host: unit, fixture, real-binary and chroot tests
# Without pytest arguments the suite runs as pytest processes side by side, each logging to a file that is
# printed when all are done: one per shard of tests/conftest.py (the shared fleets' tests, the module
# fleets' tests, and everything that boots no host, then the qemu host's), each taking the others' tests
# too when done with its own, a module at a time (tests/claims.py): the module fleets', then what boots no
# host (from its last module back), then the qemu host's; with --fast,
# two processes sharing the tests that boot no host a module at a time. With pytest arguments, as one
# process.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=
if [ "${1:-}" = --fast ]; then
    shift
    fast=1
fi
bash scripts/setup.sh
bash scripts/lint.sh
# containerd 2.3 and 2.4 from upstream source, built once per machine into the cache before the test processes
# start (they would otherwise build them side by side); it says what each was built from.
.venv/bin/python -m tests.realbin.upstream
if [ "$#" -gt 0 ]; then
    if [ -n "$fast" ]; then
        exec .venv/bin/pytest -m "not fleet and not vm" "$@"
    fi
    exec .venv/bin/pytest "$@"
fi

logs=$(mktemp -d /tmp/gpunode-tests.XXXXXX)
mkdir "$logs/claims"
if [ -n "$fast" ]; then
    runs=(fast-1 fast-2)
else
    runs=(session modules fast)
fi
pids=()
# Job control: each process in a process group of its own, so that an interrupt reaches them once, from
# the trap below; a shard takes SIGINT although started as a background job (tests/conftest.py) and
# tears its fleets and mounts down.
set -m
for run in "${runs[@]}"; do
    case "$run" in
        fast-*) selection=(--shard fast) ;;
        modules) selection=(--shard "vm,modules,fast") ;;
        session) selection=(--shard "session,modules,fast,vm") ;;
        fast) selection=(--shard "fast,vm,modules") ;;
    esac
    .venv/bin/pytest "${selection[@]}" --claim-modules="$logs/claims" -p no:cacheprovider --basetemp "$logs/$run" --durations=25 \
        >"$logs/$run.log" 2>&1 &
    pids+=("$!")
    echo "$run: pytest $! (log $logs/$run.log)"
done
trap 'kill -INT "${pids[@]}" 2>/dev/null' INT TERM
failed=()
for i in "${!runs[@]}"; do
    wait "${pids[$i]}" || failed+=("${runs[$i]}")
done
for run in "${runs[@]}"; do
    echo "=================================== $run ==================================="
    cat "$logs/$run.log"
done
for run in "${runs[@]}"; do
    echo "$run: $(tail -n 1 "$logs/$run.log")"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]} (logs in $logs)"
    exit 1
fi
rm -rf --one-file-system "$logs"
