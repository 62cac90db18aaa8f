"""Facts about the NVIDIA Container Toolkit: its packages, binaries and apt repository."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode import shell
from pyinfra_gpunode.sections import DPKG_FORMAT, MARK, parse_dpkg_status, split_sections


class ToolkitInfo(TypedDict):
    """``NvidiaContainerToolkit``'s value."""

    ctk_version: str | None
    ctk_path: str | None
    packages: dict[str, str]
    held: list[str]
    runtime_binary: str | None
    keyring_fingerprints: list[str]
    repo_list: str | None


TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"


# Print nvidia-ctk, the toolkit packages, the runtime, the keyring's keys and the apt source
# (shell/container-toolkit.sh).
_READ = shell.script(Path(__file__).parent / "shell" / "container-toolkit.sh")


def toolkit_command(keyring: str = TOOLKIT_KEYRING, source_list: str = TOOLKIT_LIST) -> str:
    """``NvidiaContainerToolkit``'s command, reading the keyring ``keyring`` and the apt source ``source_list``."""
    return shell.command(_READ, "gpunode-container-toolkit", MARK, DPKG_FORMAT, keyring, source_list, *TOOLKIT_PACKAGES)


class NvidiaContainerToolkit(FactBase[ToolkitInfo]):
    """
    Returns the NVIDIA Container Toolkit state: ``nvidia-ctk --version`` and where
    ``nvidia-ctk`` is, its four packages with versions and holds, where
    ``nvidia-container-runtime`` is, the primary-key fingerprints of the repository keyring
    (needs ``gpg``; subkeys not listed) and the repository list file's content.

    .. code:: python

        {
            "ctk_version": "1.17.0",
            "ctk_path": "/usr/bin/nvidia-ctk",
            "packages": {"nvidia-container-toolkit": "1.17.0-1"},
            "held": ["nvidia-container-toolkit"],
            "runtime_binary": "/usr/bin/nvidia-container-runtime",
            "keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"],
            "repo_list": None,
        }
    """

    @override
    def command(self) -> str:
        return toolkit_command()

    @staticmethod
    def default() -> ToolkitInfo:
        return NvidiaContainerToolkit().process([])

    @override
    def process(self, output: list[str]) -> ToolkitInfo:
        sections = split_sections(output)
        ctk = [line.split()[-1] for line in sections.get("ctk", []) if "version" in line and line.split()]
        packages = parse_dpkg_status(sections.get("packages", []))
        runtime = [line.strip() for line in sections.get("runtime", []) if line.strip().startswith("/")]
        ctk_path = [line.strip() for line in sections.get("ctk_path", []) if line.strip().startswith("/")]
        listing = sections.get("list")
        return {
            "ctk_version": ctk[0] if ctk else None,
            "ctk_path": ctk_path[0] if ctk_path else None,
            "packages": {name: info["version"] for name, info in sorted(packages.items())},
            "held": sorted(name for name, info in packages.items() if info["held"]),
            "runtime_binary": runtime[0] if runtime else None,
            "keyring_fingerprints": [line.strip() for line in sections.get("keyring", []) if line.strip()],
            "repo_list": None if listing is None else "\n".join(listing) + "\n",
        }
