"""Run shell commands against a scenario ``/etc/containerd`` with a real containerd binary.

Each call enters a private mount namespace with an overlay over ``/etc`` (the scenario's
files live in the overlay's upper directory) and tmpfs over ``/run``, ``/var/lib`` and
``/opt``, so nothing is written to this machine. Root is required.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase

from tests.realbin.debian import containerd_binary


class ScenarioHost:
    """A scratch "node": an ``/etc/containerd`` tree and one containerd version."""

    def __init__(self, scratch: Path, version: str):
        self.scratch = scratch
        self.version = version
        self.binary = containerd_binary(version)
        self.upper = scratch / "upper"
        (scratch / "work").mkdir(parents=True, exist_ok=True)
        self.upper.mkdir(parents=True, exist_ok=True)

    def write(self, path: str, text: str | bytes) -> None:
        """Write ``path`` (absolute, under /etc) into the scenario."""
        target = self.upper / Path(path).relative_to("/etc")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)

    def remove(self, path: str) -> None:
        """Delete ``path`` (absolute, under /etc) from the scenario, as a user or the toolkit would."""
        (self.upper / Path(path).relative_to("/etc")).unlink()

    def link(self, path: str, target: str) -> None:
        """Make ``path`` (absolute, under /etc) a symbolic link to ``target``."""
        link = self.upper / Path(path).relative_to("/etc")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)

    def snapshot(self) -> dict[str, bytes | str]:
        """Every file (content) and symbolic link (target) of the scenario's tree, by path."""
        return {
            str(path.relative_to(self.upper)): str(path.readlink()) if path.is_symlink() else path.read_bytes()
            for path in sorted(self.upper.rglob("*"))
            if path.is_symlink() or path.is_file()
        }

    def read(self, path: str) -> str | None:
        target = self.upper / Path(path).relative_to("/etc")
        return target.read_text() if target.exists() else None

    def sh(self, script: str, timeout: int = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        mounts = (
            "mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/lib && mount -t tmpfs tmpfs /opt && "
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={self.upper},workdir={self.scratch / 'work'} /etc"
        )
        inner = f"{mounts} && export PATH={shlex.quote(str(self.binary.parent))}:$PATH && {script}"
        return subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
        )

    def fact(self, fact_cls: type[FactBase[Any]], _stdin: str | None = None, **kwargs: Any) -> Any:
        """Run a fact's real command here (``_stdin`` as pyinfra passes it) and process its output."""
        fact = fact_cls()
        command = fact.command(**kwargs) if callable(fact.command) else fact.command
        done = self.sh(command, stdin=_stdin)
        assert done.returncode == 0, f"{fact_cls.__name__} failed: {done.stderr}"
        lines = done.stdout.splitlines()
        return fact.process(lines) if lines else fact.default()

    def run_daemon(self, seconds: int = 60) -> str:
        """Start the real daemon with this scenario's config; return its log once it booted (plugins
        loaded or failed, then one more second for what it logs right after) or exited, or after
        ``seconds``: on a busy machine a start takes longer than on a quiet one, never shorter."""
        state = self.scratch / "daemon"
        script = f"""
set -e
T={shlex.quote(str(state))}
mkdir -p "$T" /var/run/nri
cfg=/etc/containerd/config.toml
{{ if [ -f "$cfg" ]; then cat "$cfg"; else echo 'version = 2'; fi; }} | awk -v T="$T" '
  /^version/ && !done {{ print; print "root = \\"" T "/root\\""; print "state = \\"" T "/state\\""; done=1; next }} {{ print }}
  END {{ print "[grpc]"; print "  address = \\"" T "/ctd.sock\\""; print "[ttrpc]"; print "  address = \\"" T "/ctd.sock.ttrpc\\"" }}' > "$T/config.toml"
containerd --config "$T/config.toml" --log-level info > "$T/log" 2>&1 &
pid=$!
end=$(($(date +%s) + {seconds}))
while kill -0 "$pid" 2>/dev/null && ! grep -q 'containerd successfully booted' "$T/log" && [ "$(date +%s)" -lt "$end" ]; do
    sleep 0.2
done
sleep 1
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" || true
cat "$T/log"
"""
        done = self.sh(script, timeout=seconds + 30)
        return done.stdout
