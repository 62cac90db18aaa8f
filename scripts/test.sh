#!/usr/bin/env bash
# Run every test: lint, format and type checks (scripts/lint.sh), unit and fixture tests, the
# real-containerd matrix, the chroot tests and the test-fleet integration tests. Needs root
# (namespaces, chroot, systemd-nspawn).
#
# Usage: scripts/test.sh [--fast] [PYTEST ARGUMENTS...]
#   --fast   only the tests that boot no test host: unit, fixture, real-binary and chroot tests
set -euo pipefail
cd "$(dirname "$0")/.."
selection=()
if [ "${1:-}" = --fast ]; then
    shift
    selection=(-m "not fleet and not vm")
fi
bash scripts/setup.sh
bash scripts/lint.sh
exec .venv/bin/pytest "${selection[@]}" "$@"
