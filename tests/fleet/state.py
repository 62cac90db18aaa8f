"""The recorded state of one host: what it is, its SSH port and the processes started for it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .processes import Recorded

STATE_FILE = "host.json"


@dataclass
class HostState:
    directory: Path
    name: str
    release: str
    vm: bool
    port: int
    processes: list[Recorded] = field(default_factory=list)
    containerd: str = ""  # an upstream containerd build bound over the root's own (tests.realbin.upstream)

    @property
    def identity(self) -> Path:
        return self.directory / "identity"

    def save(self) -> None:
        data = {
            "name": self.name,
            "release": self.release,
            "vm": self.vm,
            "port": self.port,
            "containerd": self.containerd,
            "processes": [p.as_dict() for p in self.processes],
        }
        (self.directory / STATE_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> HostState:
        data = json.loads((directory / STATE_FILE).read_text())
        processes = [Recorded(**p) for p in data.pop("processes")]
        return cls(directory=directory, processes=processes, **data)
