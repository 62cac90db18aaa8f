"""What makes each host itself: machine-id, hostname, SSH host keys, root's authorized key.

The identity is a directory laid out like a root file system and stacked over the shared root as
a read-only layer, so a host keeps its keys and machine-id when its writable layer is wiped.
"""

from __future__ import annotations

import fcntl
import subprocess
import uuid
from pathlib import Path

from .archive import archive_host
from .paths import key_path


def ensure_client_key() -> Path:
    """The harness's ed25519 login key, created once in the cache."""
    key = key_path()
    if key.exists():
        return key
    key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(key.parent / ".lock", "w") as lock:  # sessions side by side (pytest-xdist workers) make one key
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not key.exists():
            fresh = key.with_name(f"{key.name}.{uuid.uuid4().hex}")
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pyinfra-gpunode fleet", "-f", str(fresh)],
                check=True,
            )
            fresh.with_name(fresh.name + ".pub").rename(key.with_name(key.name + ".pub"))
            fresh.rename(key)
    return key


def ensure_identity(identity: Path, hostname: str) -> None:
    """Create the host's keys and machine-id once; refresh hostname and authorized key."""
    etc = identity / "etc"
    (etc / "ssh").mkdir(parents=True, exist_ok=True)
    if not (etc / "ssh" / "ssh_host_ed25519_key").exists():
        subprocess.run(["ssh-keygen", "-A", "-f", str(identity)], check=True, capture_output=True)
        (etc / "machine-id").write_text(uuid.uuid4().hex + "\n")
    (etc / "hostname").write_text(hostname + "\n")
    ssh_dir = identity / "root" / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    (identity / "root").chmod(0o700)
    ssh_dir.chmod(0o700)
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(ensure_client_key().with_suffix(".pub").read_text())
    authorized.chmod(0o600)


def write_hosts_file(identity: Path, root: Path, hostname: str, archive_address: str) -> None:
    """``/etc/hosts``: the root's (minbase may have none), the host's own name, the archive's relay."""
    root_hosts = root / "etc" / "hosts"
    base = root_hosts.read_text() if root_hosts.exists() else "127.0.0.1\tlocalhost\n::1\tlocalhost\n"
    (identity / "etc" / "hosts").write_text(
        f"{base.rstrip()}\n127.0.1.1\t{hostname}\n{archive_address}\t{archive_host()}\n"
    )


def known_hosts_lines(identity: Path, port: int) -> list[str]:
    """known_hosts entries for the host's public keys as seen on ``127.0.0.1:port``."""
    lines = []
    for public in sorted((identity / "etc" / "ssh").glob("ssh_host_*_key.pub")):
        key_type, key_data = public.read_text().split()[:2]
        lines.append(f"[127.0.0.1]:{port} {key_type} {key_data}")
    return lines
