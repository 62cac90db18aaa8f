"""What a turn installs is what was downloaded before it: the toolkit's downloaded version, a turn with
none, and apt's answer about what an install would fetch, bounded."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import FactProcessError
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.operations import parse_commands
from pyinfra_testing.util import FakeState, create_host

from pyinfra_gpunode.facts.package_index import APT_DOWNLOADS_MAX, AptDownloads
from pyinfra_gpunode.facts.toolkit import TOOLKIT_PACKAGES
from pyinfra_gpunode.operations import toolkit


def test_the_toolkit_version_is_the_one_all_four_packages_were_downloaded_at() -> None:
    assert toolkit._toolkit_version(dict.fromkeys(TOOLKIT_PACKAGES, "1.17.8-1")) == "1.17.8-1"
    mixed = {**dict.fromkeys(TOOLKIT_PACKAGES, "1.17.8-1"), "libnvidia-container1": "1.18.0-1"}
    assert toolkit._toolkit_version(mixed) is None
    assert toolkit._toolkit_version(dict.fromkeys(TOOLKIT_PACKAGES[:3], "1.17.8-1")) is None
    assert toolkit._toolkit_version({"nvidia-driver": "550.163.01-2"}) is None


def test_a_turn_with_no_toolkit_downloaded_fails_and_fetches_nothing() -> None:
    """From the repository without a version, in a turn whose download recorded no toolkit: no update, no
    install that would choose a version in the turn."""
    state = FakeState()
    found = {"ctk_version": None, "packages": {}, "held": [], "runtime_binary": None,
             "keyring_fingerprints": [toolkit.TOOLKIT_FINGERPRINT], "repo_list": toolkit.TOOLKIT_REPO_LINE}  # fmt: skip
    node = create_host(state, facts={"toolkit.NvidiaContainerToolkit": found})
    with ctx_state.use(state), ctx_host.use(node):
        commands = parse_commands(list(toolkit.container_toolkit._inner(source="repository", downloaded={})))
    assert commands == [
        "printf '%s\\n' 'NVIDIA Container Toolkit: no version of it was downloaded before the turn' >&2 && exit 1"
    ]


def test_apt_naming_more_files_than_any_driver_needs_is_refused() -> None:
    line = "'http://deb.example/pool/p.deb' p_1_amd64.deb 10 MD5Sum:0"
    assert len(AptDownloads().process([line] * APT_DOWNLOADS_MAX + ["rc=0"])["files"]) == APT_DOWNLOADS_MAX
    with pytest.raises(FactProcessError):
        AptDownloads().process([line] * (APT_DOWNLOADS_MAX + 1))
