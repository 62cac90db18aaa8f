"""Turn a pyinfra inventory into testinfra hosts that connect the way pyinfra does.

Each SSH host gets an entry in a generated ssh_config (host name, port, user, key, known_hosts
file, host-key policy from the inventory's data) and is reached with testinfra's ``ssh://``
backend, which runs OpenSSH and so checks host keys (``paramiko://`` does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import testinfra
from pyinfra.api import State
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

# pyinfra's ssh_strict_host_key_checking values, as OpenSSH spells them.
STRICT_HOST_KEY_CHECKING = {"yes": "yes", "no": "no", "off": "no", "accept-new": "accept-new", "ask": "ask"}


@dataclass(frozen=True)
class Node:
    name: str
    host: Any  # testinfra.host.Host
    data: dict[str, Any]


def load_nodes(inventory_path: Path, ssh_config_path: Path) -> list[Node]:
    with ctx_state.use(State()):
        inventory = make_inventory(str(inventory_path), cwd=str(Path.cwd()))
        entries = [(host.name, host.connector_cls, host.data.dict()) for host in inventory]
    blocks: list[str] = []
    nodes: list[Node] = []
    for name, connector, data in entries:
        sudo = bool(data.get("_sudo")) or data.get("ssh_user", "root") != "root"
        if connector is LocalConnector:
            nodes.append(Node(name, testinfra.get_host("local://", sudo=sudo), data))
            continue
        if connector is not SSHConnector:
            raise ValueError(f"{name}: only SSH and @local hosts can be verified, not {connector.__name__}")
        alias = f"gpunode-verify-{len(blocks)}"
        blocks.append(_ssh_config_block(alias, name, data))
        nodes.append(Node(name, testinfra.get_host(f"ssh://{alias}", ssh_config=str(ssh_config_path), sudo=sudo), data))
    user_config = Path("~/.ssh/config").expanduser()
    include = [f"Match all\nInclude {user_config}\n"] if user_config.exists() else []
    ssh_config_path.write_text("\n".join(blocks + include))
    return nodes


def _ssh_config_block(alias: str, name: str, data: dict[str, Any]) -> str:
    options = {
        "HostName": data.get("ssh_hostname") or name,
        "Port": data.get("ssh_port"),
        "User": data.get("ssh_user"),
        "IdentityFile": data.get("ssh_key"),
        "IdentitiesOnly": "yes" if data.get("ssh_key") else None,
        "UserKnownHostsFile": data.get("ssh_known_hosts_file"),
        "StrictHostKeyChecking": STRICT_HOST_KEY_CHECKING[data.get("ssh_strict_host_key_checking", "accept-new")],
        "BatchMode": "yes",
        "ConnectTimeout": 10,
    }
    lines = [f"Host {alias}"] + [f"    {key} {value}" for key, value in options.items() if value is not None]
    return "\n".join(lines) + "\n"
