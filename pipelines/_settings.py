"""This host's host data, validated once per run: the GPU node deploy and the readiness report both ask."""

from __future__ import annotations

from pyinfra import host

from pyinfra_gpunode.hostdata import settings as settings_of
from pyinfra_gpunode.operations._internals import current_state, in_a_run
from pyinfra_gpunode.operations._run_state import run_state
from pyinfra_gpunode.settings import Settings


def validated_settings() -> Settings:
    """``hostdata.settings`` of this host's data; in a run, validated again only where the data differs from
    what was validated for this host before (a refusal, ``HostDataError``, is raised each time, never kept)."""
    data = host.data.dict()
    if not in_a_run():
        return settings_of(data)
    content = repr(sorted(data.items()))
    kept = run_state(current_state()).settings.get(host.name)
    if kept is not None and kept[0] == content:
        return kept[1]
    found = settings_of(data)
    run_state(current_state()).settings[host.name] = (content, found)
    return found
