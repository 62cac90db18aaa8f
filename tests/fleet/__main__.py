"""Command line: ``python -m tests.fleet up|down|status`` (from the repository root, as root)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from .fleet import DEFAULT_HOSTS, Fleet, HostSpec
from .paths import cache_dir
from .preflight import FleetUnavailable


def parse_host(text: str) -> HostSpec:
    """``NAME=RELEASE`` or ``NAME=RELEASE:vm``."""
    name, _, release = text.partition("=")
    release, _, mode = release.partition(":")
    if not name or not release or mode not in ("", "vm"):
        raise argparse.ArgumentTypeError(f"expected NAME=RELEASE[:vm], got {text!r}")
    return HostSpec(name, release, vm=mode == "vm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fleet", description=__doc__)
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--fleet", default="default", help="fleet name (default: %(default)s)")
    parser.add_argument(
        "--host",
        action="append",
        type=parse_host,
        metavar="NAME=RELEASE[:vm]",
        help="host to boot, repeatable (default: node1=trixie node2=trixie node3=sid)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="fleet: %(message)s")
    fleet = Fleet(args.host or DEFAULT_HOSTS, name=args.fleet)
    try:
        if args.action == "up":
            started = time.monotonic()
            fleet.up()
            print(f"fleet {fleet.name} up in {time.monotonic() - started:.1f} s")
        elif args.action == "down":
            fleet.down()
            print(f"fleet {fleet.name} down")
    except FleetUnavailable as error:
        print(f"fleet: cannot run here: {error}", file=sys.stderr)
        return 2
    print_status(fleet)
    return 0


def print_status(fleet: Fleet) -> None:
    hosts = fleet.hosts
    if not hosts:
        print(f"fleet {fleet.name}: no hosts (cache: {cache_dir()})")
        return
    state = "up" if fleet.is_up() else "not fully up"
    print(f"fleet {fleet.name}: {state}")
    for host in hosts:
        mode = "qemu" if host.vm else "nspawn"
        print(f"  {host.name:10} {host.release:10} {mode:7} ssh 127.0.0.1:{host.port}")
    print(f"  inventory:   {fleet.inventory_path}")
    print(f"  ssh config:  {fleet.ssh_config_path}   (ssh -F {fleet.ssh_config_path} {hosts[0].name})")
    print(f"  known hosts: {fleet.known_hosts_path}")


if __name__ == "__main__":
    sys.exit(main())
