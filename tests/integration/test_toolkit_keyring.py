"""The toolkit repository keyring with real gpg and real key files: exactly the pinned key, nothing else.

Keys are generated in a throwaway GNUPGHOME; the install script fetches its key file with curl from a
``file://`` URL and writes the keyring into the test's directory (the pinned fingerprint is a parameter).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyinfra_gpunode.facts.toolkit import NvidiaContainerToolkit, toolkit_command
from pyinfra_gpunode.operations.toolkit import keyring_script
from pyinfra_gpunode.toolkit_plan import keyring_needs_pin, toolkit_source

pytestmark = [
    pytest.mark.skipif(shutil.which("gpg") is None or shutil.which("curl") is None, reason="needs gpg and curl"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the script installs the keyring owned by root"),
]


def gpg(home: Path, *args: str) -> str:
    done = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--quiet", *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def new_key(home: Path, uid: str, subkey: bool = False) -> str:
    gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
    fingerprint = gpg(home, "--with-colons", "--list-keys", uid).split("fpr:::::::::", 1)[1].split(":", 1)[0]
    if subkey:
        gpg(home, "--passphrase", "", "--quick-add-key", fingerprint, "cv25519", "encr", "never")
    return fingerprint


def fingerprints(path: Path, tmp: Path) -> list[str]:
    """What the fact reports for the keyring ``path`` (its own command, run for real: it only reads)."""
    home = tmp / "fact-home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    command = toolkit_command(keyring=str(path), source_list=str(tmp / "absent.list"))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert not (home / ".gnupg").exists(), "reading a keyring created ~/.gnupg"
    return list(NvidiaContainerToolkit().process(done.stdout.splitlines())["keyring_fingerprints"])


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[dict[str, object]]:
    home = tmp_path / "gnupg"
    try:
        yield _make_keys(home, tmp_path)
    finally:  # key generation started a gpg-agent for this home: it must not outlive the test
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)


def _make_keys(home: Path, tmp_path: Path) -> dict[str, object]:
    home.mkdir(mode=0o700)
    (tmp_path / "home").mkdir()
    pinned = new_key(home, "Pinned <pinned@example.org>", subkey=True)
    other = new_key(home, "Other <other@example.org>")
    # The pinned key first, then another: the first fingerprint in the file is the pinned one.
    both = tmp_path / "both.asc"
    both.write_text(gpg(home, "--armor", "--export", pinned) + gpg(home, "--armor", "--export", other))
    only_other = tmp_path / "other.asc"
    only_other.write_text(gpg(home, "--armor", "--export", other))
    binary_both = tmp_path / "both.gpg"
    binary_both.write_bytes(subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--export", pinned, other], capture_output=True, check=True
    ).stdout)  # fmt: skip
    return {"pinned": pinned, "other": other, "both": both, "only_other": only_other, "binary_both": binary_both}


def install(tmp: Path, fingerprint: str, key_file: Path, keyring: Path) -> subprocess.CompletedProcess[str]:
    script = keyring_script(fingerprint=fingerprint, url=f"file://{key_file}", keyring=str(keyring))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home")}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


def test_fact_lists_every_primary_key_not_subkeys(keys: dict, tmp_path: Path) -> None:
    assert fingerprints(keys["binary_both"], tmp_path) == [keys["pinned"], keys["other"]]


def test_keyring_gets_exactly_the_pinned_key(keys: dict, tmp_path: Path) -> None:
    keyring = tmp_path / "keyrings" / "toolkit.gpg"
    keyring.parent.mkdir()
    done = install(tmp_path, keys["pinned"], keys["both"], keyring)
    assert done.returncode == 0, done.stderr
    assert fingerprints(keyring, tmp_path) == [keys["pinned"]]
    listing = subprocess.run(
        ["gpg", "--homedir", str(tmp_path / "gnupg"), "--show-keys", "--with-colons", str(keyring)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "Other" not in listing and listing.count("\nsub:") == 1  # the pinned key keeps its subkey
    assert oct(keyring.stat().st_mode & 0o777) == "0o644"
    assert not (tmp_path / "home" / ".gnupg").exists()


def test_keyring_with_another_key_is_replaced(keys: dict, tmp_path: Path) -> None:
    keyring = tmp_path / "toolkit.gpg"
    shutil.copy(keys["binary_both"], keyring)  # the pinned key is present, and so is another
    assert fingerprints(keyring, tmp_path) != [keys["pinned"]]  # the operation replaces it
    done = install(tmp_path, keys["pinned"], keys["both"], keyring)
    assert done.returncode == 0, done.stderr
    assert fingerprints(keyring, tmp_path) == [keys["pinned"]]


def test_installed_toolkit_keyring_with_another_key_is_found_and_replaced(keys: dict, tmp_path: Path) -> None:
    """A node whose toolkit is installed (``auto`` takes it as ``installed``) with its repository
    configured: the keyring is still read, and one holding another key is rewritten."""
    source = toolkit_source("auto", None, {"nvidia-container-toolkit": "1.17.8-1"}, False)
    assert source == "installed"
    keyring = tmp_path / "toolkit.gpg"
    shutil.copy(keys["binary_both"], keyring)
    assert keyring_needs_pin(source, True, fingerprints(keyring, tmp_path), keys["pinned"])
    assert not keyring_needs_pin(source, False, fingerprints(keyring, tmp_path), keys["pinned"])  # apt reads it not
    done = install(tmp_path, keys["pinned"], keys["both"], keyring)
    assert done.returncode == 0, done.stderr
    assert not keyring_needs_pin(source, True, fingerprints(keyring, tmp_path), keys["pinned"])
    assert not keyring_needs_pin("repository", True, fingerprints(keyring, tmp_path), keys["pinned"])


def test_key_file_without_the_pinned_key_is_refused(keys: dict, tmp_path: Path) -> None:
    keyring = tmp_path / "toolkit.gpg"
    shutil.copy(keys["binary_both"], keyring)
    before = keyring.read_bytes()
    done = install(tmp_path, keys["pinned"], keys["only_other"], keyring)
    assert done.returncode == 1
    assert f"holds no key {keys['pinned']} (it holds: {keys['other']})" in done.stderr
    assert keyring.read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("toolkit")) == ["toolkit.gpg"]
