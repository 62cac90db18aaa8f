#!/usr/bin/env bash
# Run every test: lint, format and type checks (scripts/lint.sh), unit and fixture tests, the
# real-containerd matrix and the test-fleet integration tests. Needs root (namespaces, systemd-nspawn).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
exec .venv/bin/pytest "$@"
