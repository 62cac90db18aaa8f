#!/usr/bin/env bash
# Type-check the package as users import it. The top-level directories are installed under
# other names (gpunode/ is pyinfra_gpunode, facts/ is pyinfra_gpunode.facts, ...), which mypy cannot
# follow, so they are linked into a temporary tree under their package names and mypy checks that
# package: the calls between its modules are checked, not taken as Any.
# mypy's cache stays in this checkout's .mypy_cache: the linked tree is new each time, and mypy
# checks every cached module against its file's size, time and content before it trusts it.
# Usage: scripts/typecheck.sh [SOURCE_ROOT]   (default: this checkout)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "${1:-$here}" && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
pkg=$tree/pyinfra_gpunode
mkdir "$pkg"
ln -s "$root"/gpunode/*.py "$root"/gpunode/py.typed "$pkg"/
for sub in facts operations pipelines verify templates; do
    ln -s "$root/$sub" "$pkg/$sub"
done
# mypy names the linked paths; the sed names the checkout's files instead.
cd "$tree"
MYPYPATH=$tree "$here/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$here/.mypy_cache" \
    -p pyinfra_gpunode \
    | sed -E -e 's#^pyinfra_gpunode/(facts|operations|pipelines|verify|templates)/#\1/#' -e 's#^pyinfra_gpunode/#gpunode/#'
