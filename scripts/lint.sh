#!/usr/bin/env bash
# Lint, format check, type check, shellcheck and the check of what operations/_internals.py assumes of
# the installed pyinfra, with the .venv and tools that scripts/setup.sh makes.
# Runs every check and fails if any of them fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
status=0
.venv/bin/ruff check . || status=1
.venv/bin/ruff format --check . || status=1
bash scripts/typecheck.sh || status=1
shellcheck scripts/*.sh operations/shell/*.sh facts/shell/*.sh || status=1
.venv/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_pyinfra_internals.py || status=1
exit "$status"
