#!/usr/bin/env bash
# Run every test: lint, types, unit and fixture tests, the real-containerd matrix and the
# test-fleet integration tests. Needs root (namespaces, systemd-nspawn).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy gpunode facts operations verify
exec .venv/bin/pytest "$@"
