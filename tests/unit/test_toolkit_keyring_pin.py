"""When the toolkit repository keyring must be rewritten to hold exactly the pinned key (pure logic)."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.toolkit_plan import keyring_needs_pin

PIN, OTHER = "C95B321B61E88C1809C4F759DDCAE044F796ECB0", "DC9C8474A2EDC0E76812855AF0FB93D6E443B396"


@pytest.mark.parametrize("source", ["auto", "installed", "deb_dir", "repository"])
@pytest.mark.parametrize("keys", [[OTHER], [PIN, OTHER], [OTHER, PIN], [PIN, PIN]])
def test_configured_repository_with_any_other_key_is_rewritten_whatever_the_source(source: str, keys: list) -> None:
    assert keyring_needs_pin(source, True, keys, PIN)


@pytest.mark.parametrize("source", ["auto", "installed", "deb_dir", "repository"])
@pytest.mark.parametrize("keys", [[], [PIN]])
def test_exactly_the_pinned_key_or_no_keyring_is_left(source: str, keys: list) -> None:
    assert not keyring_needs_pin(source, True, keys, PIN)


@pytest.mark.parametrize("source", ["auto", "installed", "deb_dir"])
def test_keyring_apt_does_not_read_is_left(source: str) -> None:
    assert not keyring_needs_pin(source, False, [PIN, OTHER], PIN)


def test_repository_source_checks_the_keyring_before_its_list_is_written() -> None:
    assert keyring_needs_pin("repository", False, [PIN, OTHER], PIN)
