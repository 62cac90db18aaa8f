#!/usr/bin/env bash
# Prepare a fresh Debian machine for pyinfra-gpunode's tests and demo:
# host tools from Debian's archive, then a virtual environment in .venv with the package
# installed in editable mode. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

host_tools=(debootstrap systemd-container socat openssh-client e2fsprogs iproute2 dpkg-dev python3-venv qemu-system-x86 qemu-utils vagrant shellcheck zsh fish)
missing=()
for pkg in "${host_tools[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: need root to install ${missing[*]}" >&2
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/pip ]; then
    python3 -m venv --clear .venv  # also mends a venv whose creation was cut off before pip
fi
if ! .venv/bin/python -c 'import pyinfra_gpunode, pyinfra_testing' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[test]'
    touch .venv/.installed
fi
