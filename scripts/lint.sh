#!/usr/bin/env bash
# Lint, format check and type check, with the .venv that scripts/setup.sh makes.
# Runs all three and fails if any of them fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
status=0
.venv/bin/ruff check . || status=1
.venv/bin/ruff format --check . || status=1
bash scripts/typecheck.sh || status=1
exit "$status"
