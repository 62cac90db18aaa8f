"""The pyinfra CLI as the tests run it: this environment's ``pyinfra`` in a process of its own, so it
sets itself up (gevent, logging, the ``deploys/`` path) as it does for users."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).with_name("pyinfra")


def pyinfra(
    *args: str | Path,
    cwd: Path = REPO,
    merged: bool = True,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``pyinfra ARGS`` run in ``cwd`` (the checkout by default: deploy files are named relative to it).

    ``merged``: stderr goes into stdout, which then carries the whole log in order; otherwise the two
    are kept apart. ``env`` is added to this process's environment.
    """
    return subprocess.run(
        [str(PYINFRA), *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env is not None else None,
    )
