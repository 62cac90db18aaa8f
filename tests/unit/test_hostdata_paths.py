"""Path keys of the host data: absolute and normalised or refused naming the key; world-writable places warned."""

from __future__ import annotations

import re

import pytest

from pyinfra_gpunode.hostdata import KEYS, HostDataError, validate, world_writable_warnings

PATH_KEYS = ["gpunode_containerd_dropin_dir", "gpunode_nvidia_runtime_binary", "gpunode_toolkit_deb_dir",
             "gpunode_cdi_spec_path"]  # fmt: skip
LIST_KEYS = ["gpunode_cdi_spec_dirs"]
NOT_NORMALISED = [
    "etc/cdi",  # relative
    "./etc/cdi",
    "/etc/../tmp/cdi",
    "/etc/cdi/..",
    "/etc/./cdi",
    "/etc//cdi",
    "//etc/cdi",
    "/etc/cdi/",
    "",
]


def test_every_node_path_key_is_covered() -> None:
    assert sorted(name for name, key in KEYS.items() if key.node_path) == sorted(PATH_KEYS + LIST_KEYS)


@pytest.mark.parametrize("key", PATH_KEYS)
@pytest.mark.parametrize("value", NOT_NORMALISED)
def test_path_key_refuses_relative_or_unnormalised(key: str, value: str) -> None:
    expected = rf"^host-data key '{key}' must be absolute normalised path( or null)?, got '{re.escape(value)}'$"
    with pytest.raises(HostDataError, match=expected):
        validate({key: value})


@pytest.mark.parametrize("key", LIST_KEYS)
@pytest.mark.parametrize("value", NOT_NORMALISED)
def test_path_list_key_refuses_any_relative_or_unnormalised_entry(key: str, value: str) -> None:
    expected = rf"^host-data key '{key}' must be list of absolute normalised paths( or null)?, got"
    with pytest.raises(HostDataError, match=expected):
        validate({key: ["/etc/cdi", value]})


@pytest.mark.parametrize("key", PATH_KEYS)
def test_path_key_takes_normalised_absolute_paths(key: str) -> None:
    for value in ("/", "/srv/gpu node/x", "/opt/nvidia/bin/nvidia-container-runtime"):
        assert validate({key: value})[key] == value


def test_path_list_key_takes_normalised_absolute_paths() -> None:
    assert validate({"gpunode_cdi_spec_dirs": ["/etc/cdi", "/run/cdi"]})["gpunode_cdi_spec_dirs"] == [
        "/etc/cdi",
        "/run/cdi",
    ]


def test_defaults_are_not_warned() -> None:
    assert world_writable_warnings(validate({})) == []


@pytest.mark.parametrize("key", PATH_KEYS + LIST_KEYS)
@pytest.mark.parametrize("place", ["/tmp", "/tmp/nvidia", "/var/tmp/x/y", "/dev/shm/cdi"])
def test_world_writable_place_is_warned_naming_the_key(key: str, place: str) -> None:
    values = validate({key: [place] if key in LIST_KEYS else place})
    (warning,) = world_writable_warnings(values)
    assert warning.startswith(f"host-data key {key!r} is {place!r}, under a directory anyone may write to")


@pytest.mark.parametrize("place", ["/tmpfs/cdi", "/var/tmpdir", "/dev/shmem", "/etc/tmp"])
def test_names_that_only_look_like_world_writable_places_are_not_warned(place: str) -> None:
    assert world_writable_warnings(validate({"gpunode_cdi_spec_path": place})) == []
