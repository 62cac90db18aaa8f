"""A node's containerd and apt reads are left behind after their time limit, and the node fails naming
the read: the commands' own shell logic run against programs that end as ``timeout`` ends one (status
124), and against ones that answer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from pyinfra_gpunode.facts.containerd import ContainerdVersion
from pyinfra_gpunode.facts.package_index import AptDownloads, NvidiaAptVersions
from pyinfra_gpunode.read_limits import APT_SECONDS, VERSION_SECONDS, dump_seconds, unanswered


def run(command: str, tmp_path: Path, programs: dict[str, str]) -> list[str]:
    """``command`` run by sh with stand-ins for ``programs`` (name -> its shell body) first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in programs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=30, check=True)
    return result.stdout.splitlines()


LEFT_BEHIND = "exit 124"  # what timeout returns for a program it ended


def test_a_containerd_version_left_behind_fails_the_node_naming_it(tmp_path: Path) -> None:
    fact = ContainerdVersion()
    answered = run(
        fact.command(), tmp_path, {"containerd": "echo 'containerd github.com/containerd/containerd v2.3.4 x'"}
    )
    assert fact.process(answered)["minor"] == 3  # type: ignore[index]
    with pytest.raises(FactProcessError, match=f"containerd --version did not answer within {VERSION_SECONDS} s"):
        fact.process(run(fact.command(), tmp_path, {"containerd": LEFT_BEHIND}))
    with pytest.raises(FactProcessError, match="unknown form"):  # another failure is no time limit's
        fact.process(run(fact.command(), tmp_path, {"containerd": "echo garbage; exit 3"}))


def test_apt_cache_left_behind_fails_the_node_naming_it(tmp_path: Path) -> None:
    fact = NvidiaAptVersions()
    line = "nvidia-driver | 550.163.01-2 | http://deb.debian.org/debian trixie/non-free amd64 Packages"
    assert fact.process(run(fact.command(["nvidia-driver"]), tmp_path, {"apt-cache": f"echo '{line}'"})) == {
        "nvidia-driver": ["550.163.01-2"]
    }
    assert fact.process(run(fact.command(["nvidia-driver"]), tmp_path, {"apt-cache": "exit 100"})) == {}
    with pytest.raises(FactProcessError, match=f"apt-cache madison did not answer within {APT_SECONDS} s"):
        fact.process(run(fact.command(["nvidia-driver"]), tmp_path, {"apt-cache": LEFT_BEHIND}))
    with pytest.raises(FactProcessError, match="more than 20000 lines"):
        fact.process([line] * 20001)


def test_apt_get_left_behind_is_the_download_check_s_named_error(tmp_path: Path) -> None:
    fact = AptDownloads()
    found = fact.process(run(fact.command(["nvidia-driver"]), tmp_path, {"apt-get": LEFT_BEHIND}))
    assert found == {"files": [], "error": f"apt-get --print-uris did not answer within {APT_SECONDS} s: left "
                     "behind, and this node not read further"}  # fmt: skip
    assert unanswered(found["error"])
    assert not unanswered("apt-get exited 100")


@pytest.mark.parametrize("text", ["0", "3601", "ten", "٣", "-5", ""])
def test_a_dump_time_limit_outside_its_range_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("GPUNODE_DUMP_SECONDS", text)
    with pytest.raises(Exception, match=r"GPUNODE_DUMP_SECONDS=.*: give whole seconds from 1 to 3600"):
        dump_seconds()
    monkeypatch.setenv("GPUNODE_DUMP_SECONDS", "15")
    assert dump_seconds() == 15
    monkeypatch.delenv("GPUNODE_DUMP_SECONDS")
    assert dump_seconds() == 60
