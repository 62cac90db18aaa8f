"""pyinfra inventory of the Vagrantfile's VMs, with strict host-key checking:

    vagrant up && .venv/bin/pyinfra inventories/vagrant.py deploys/gpu_node.py

Connection settings come from ``vagrant ssh-config``. Each VM's SSH host keys are read once
through ``vagrant ssh`` (Vagrant's own key-authenticated channel) and pinned in
``.vagrant/gpunode_known_hosts``; after that pyinfra refuses a VM whose key changed. When a VM
is destroyed and created again, delete its lines from that file.
"""

import subprocess
from pathlib import Path

_PROJECT = Path(__file__).resolve().parent.parent
_KNOWN_HOSTS = _PROJECT / ".vagrant" / "gpunode_known_hosts"


def _vagrant(*args):
    return subprocess.run(["vagrant", *args], cwd=_PROJECT, capture_output=True, text=True)


def _ssh_configs():
    """``{name: {option: value}}`` from ``vagrant ssh-config`` (machines not running are left out)."""
    result = _vagrant("ssh-config")
    configs, current = {}, None
    for line in result.stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "Host":
            current = configs.setdefault(value, {})
        elif current is not None and key:
            current[key] = value.strip().strip('"')
    if not configs:
        raise RuntimeError(f"no running Vagrant machines (vagrant ssh-config: {result.stderr.strip()})")
    return configs


def _pin_host_keys(name, address):
    pinned = _KNOWN_HOSTS.read_text().splitlines() if _KNOWN_HOSTS.exists() else []
    if any(line.startswith(f"{address} ") for line in pinned):
        return
    keys = _vagrant("ssh", name, "-c", "cat /etc/ssh/ssh_host_*_key.pub")
    if keys.returncode != 0:
        raise RuntimeError(f"{name}: cannot read its SSH host keys: {keys.stderr.strip()}")
    public_keys = [line.split()[:2] for line in keys.stdout.splitlines() if line.startswith(("ssh-", "ecdsa-"))]
    entries = [" ".join([address, *key]) for key in public_keys]
    _KNOWN_HOSTS.parent.mkdir(exist_ok=True)
    _KNOWN_HOSTS.write_text("".join(f"{line}\n" for line in pinned + entries))


def _host(name, config):
    port = int(config.get("Port", "22"))
    hostname = config["HostName"]
    _pin_host_keys(name, f"[{hostname}]:{port}" if port != 22 else hostname)
    return (
        name,
        {
            "ssh_hostname": hostname,
            "ssh_port": port,
            "ssh_user": config.get("User", "vagrant"),
            "ssh_key": config["IdentityFile"],
            "ssh_known_hosts_file": str(_KNOWN_HOSTS),
            "ssh_strict_host_key_checking": "yes",
            "_sudo": True,
        },
    )


hosts = [_host(name, config) for name, config in sorted(_ssh_configs().items())]
