"""A host as a systemd-nspawn container: overlay root, loopback-only network namespace, SSH relay.

Per host: an overlay (writable layer over the host's identity over the shared root), a network
namespace ``th-<name>`` holding only ``lo``, a cgroup of its own, and a wrapper shell that joins
that cgroup and boots the container again when it reboots (nspawn exits with 133). sshd is
reached through ``127.0.0.1:<port>`` -> unix socket -> ``127.0.0.1:22`` inside the namespace; the
archive through ``127.0.0.1:80`` inside the namespace -> the fleet's archive socket.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import cgroups, processes
from .identity import write_hosts_file
from .state import HostState

WRAPPER = """\
for procs in $FLEET_CGROUP_PROCS; do echo $$ > "$procs"; done
trap 'stopping=1' TERM
while :; do
    "$@"
    status=$?
    [ "$status" = 133 ] && [ -z "${stopping:-}" ] || exit "$status"
done
"""


def netns_name(host: str) -> str:
    return f"th-{host}"


def upstream_binds(version: str) -> list[str]:
    """nspawn arguments binding containerd ``version``'s build (``""``: none) over the root's binaries."""
    if not version:
        return []
    from tests.realbin import upstream  # here: upstream's own imports come back to this package

    built = upstream.containerd_binary(version).parent
    return [f"--bind-ro={built / command}:/usr/bin/{command}" for command in upstream.COMMANDS]


def boot(state: HostState, root: Path, archive_socket: Path) -> None:
    """Start the container and its relays, recording their PIDs in ``state``."""
    d = state.directory
    write_hosts_file(state.identity, root, state.name, "127.0.0.1")
    for sub in ("upper", "work", "merged", "containerd"):
        (d / sub).mkdir(exist_ok=True)
    if not is_mounted(d / "merged"):
        options = f"lowerdir={state.identity}:{root},upperdir={d / 'upper'},workdir={d / 'work'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(d / "merged")], check=True)
    netns = netns_name(state.name)
    if not Path("/run/netns", netns).exists():
        subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    cgroup_procs = " ".join(str(p / "cgroup.procs") for p in cgroups.create(state.name))
    nspawn = [
        "systemd-nspawn",
        "--quiet",
        "-D",
        str(d / "merged"),
        "--boot",
        "-M",
        state.name,
        "--register=no",
        "--keep-unit",
        "--link-journal=no",
        "--resolv-conf=off",
        "--console=read-only",
        f"--network-namespace-path=/run/netns/{netns}",
        f"--bind={d / 'containerd'}:/var/lib/containerd",
        *upstream_binds(state.containerd),
    ]
    ssh_socket = d / "ssh.sock"
    in_netns = ["ip", "netns", "exec", netns]
    log = d / "relays.log"
    state.processes = [
        processes.start(
            "nspawn",
            ["sh", "-c", WRAPPER, "nspawn-wrapper", *nspawn],
            d / "console.log",
            env={"FLEET_CGROUP_PROCS": cgroup_procs, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
        ),
        processes.start(
            "ssh-relay-inside",
            [*in_netns, "socat", f"UNIX-LISTEN:{ssh_socket},fork,unlink-early", "TCP:127.0.0.1:22"],
            log,
        ),
        processes.start(
            "ssh-relay",
            ["socat", f"TCP-LISTEN:{state.port},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{ssh_socket}"],
            log,
        ),
        processes.start(
            "archive-relay-inside",
            [
                *in_netns,
                "socat",
                "TCP-LISTEN:80,bind=127.0.0.1,fork,reuseaddr",
                f"UNIX-CONNECT:{archive_socket}",
            ],
            log,
        ),
    ]
    state.save()


def stop(state: HostState) -> None:
    """Power the container off (SIGTERM to nspawn), stop the relays, undo mount, netns, cgroups."""
    processes.stop(state.processes)
    state.processes = []
    state.save()
    merged = state.directory / "merged"
    if is_mounted(merged):
        subprocess.run(["umount", str(merged)], check=True)
    if Path("/run/netns", netns_name(state.name)).exists():
        subprocess.run(["ip", "netns", "delete", netns_name(state.name)], check=True)
    cgroups.remove(state.name)


def wipe_disk(state: HostState) -> None:
    """Forget everything the host wrote; its identity layer stays."""
    for sub in ("upper", "work", "containerd"):
        subprocess.run(["rm", "-rf", "--one-file-system", str(state.directory / sub)], check=True)


def is_mounted(path: Path) -> bool:
    return str(path.resolve()) in _mount_points()


def unmount_all_under(directory: Path) -> None:
    """Unmount whatever is still mounted at or below ``directory``, deepest first (an interrupted boot
    can leave an overlay behind), so that ``rm -rf --one-file-system`` can remove it."""
    top = str(directory.resolve())
    inside = [point for point in _mount_points() if point == top or point.startswith(top + "/")]
    for point in sorted(inside, key=lambda p: p.count("/"), reverse=True):
        subprocess.run(["umount", point], check=True)


def _mount_points() -> list[str]:
    """Mount points of this mount namespace, with mountinfo's octal escapes (\\040 for a space) undone."""
    with open("/proc/self/mountinfo") as mountinfo:
        return [_unescape(line.split()[4]) for line in mountinfo]


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)
