"""Local test fleet: Debian hosts with real systemd, sshd and containerd, booted with systemd-nspawn
(or qemu for a real kernel), reachable only over SSH on 127.0.0.1."""

from .fleet import DEFAULT_HOSTS, Fleet, Host, HostSpec
from .preflight import FleetUnavailable

__all__ = ["DEFAULT_HOSTS", "Fleet", "FleetUnavailable", "Host", "HostSpec"]
