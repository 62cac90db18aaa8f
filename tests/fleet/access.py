"""Files through which pyinfra, testinfra and ssh reach the fleet, all with strict host-key checking."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .identity import known_hosts_lines
from .state import HostState


def write_known_hosts(path: Path, hosts: Sequence[HostState]) -> None:
    lines = [line for host in hosts for line in known_hosts_lines(host.identity, host.port)]
    path.write_text("".join(f"{line}\n" for line in lines))


def write_ssh_config(path: Path, hosts: Sequence[HostState], key: Path, known_hosts: Path) -> None:
    blocks = [
        f"Host {host.name}\n"
        f"    HostName 127.0.0.1\n"
        f"    Port {host.port}\n"
        f"    User root\n"
        f"    IdentityFile {key}\n"
        f"    IdentitiesOnly yes\n"
        f"    StrictHostKeyChecking yes\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        f"    GlobalKnownHostsFile /dev/null\n"
        f"    BatchMode yes\n"
        f"    ConnectTimeout 5\n"
        f"    LogLevel ERROR\n"
        for host in hosts
    ]
    path.write_text("\n".join(blocks))


def write_inventory(path: Path, hosts: Sequence[HostState], key: Path, known_hosts: Path) -> None:
    entries = [
        f"    ({host.name!r}, {{\n"
        f'        "ssh_hostname": "127.0.0.1",\n'
        f'        "ssh_port": {host.port},\n'
        f'        "ssh_user": "root",\n'
        f'        "ssh_key": {str(key)!r},\n'
        f'        "ssh_known_hosts_file": {str(known_hosts)!r},\n'
        f'        "ssh_strict_host_key_checking": "yes",\n'
        f"    }}),\n"
        for host in hosts
    ]
    path.write_text(
        '"""pyinfra inventory of the local test fleet (written by `python -m tests.fleet up`)."""\n\n'
        "hosts = [\n" + "".join(entries) + "]\n"
    )
