#!/bin/sh
# Provision a Vagrant VM as a GPU-node candidate for deploys/gpu_node.py: containerd from the
# distribution's own archive, enabled and running, with the config.toml its package ships (Debian
# ships version 2; where a package ships none, the deploy creates it). Safe to run again: it
# installs only what is missing and leaves an installed containerd and its config as they are.
set -eu

export DEBIAN_FRONTEND=noninteractive

installed() {
    [ "$(dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

if ! installed containerd; then
    apt-get update -q
    apt-get install -y -q -o Dpkg::Options::=--force-confold containerd
fi

systemctl enable --quiet containerd
systemctl is-active --quiet containerd || systemctl start containerd
systemctl is-active --quiet containerd
containerd --version
