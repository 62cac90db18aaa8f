"""Facts about the NVIDIA Container Toolkit: its packages, binaries and apt repository."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase
from typing_extensions import override

from pyinfra_gpunode.sections import dpkg_query, marker, parse_dpkg_status, split_sections


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


def primary_fingerprints(path: str) -> str:
    """Shell printing the primary keys' fingerprints in the key file ``path`` (a shell word), one a line.

    Subkeys are not listed. gpg runs in a throwaway home, so the node's own ``~/.gnupg`` is not created.
    """
    return (
        f'gpghome=$(mktemp -d) && {{ gpg --homedir "$gpghome" --batch --show-keys --with-colons {path} 2>/dev/null '
        '| awk -F: \'$1 == "pub" {want = 1} $1 == "sub" {want = 0} $1 == "fpr" && want {print $10; want = 0}\'; '
        'rm -rf "$gpghome"; }'
    )


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
        return "; ".join(
            [
                marker("ctk"),
                "if command -v nvidia-ctk >/dev/null 2>&1; then nvidia-ctk --version 2>/dev/null | head -n 1; fi",
                marker("ctk_path"),
                "command -v nvidia-ctk || true",
                marker("packages"),
                dpkg_query(*TOOLKIT_PACKAGES),
                marker("runtime"),
                "command -v nvidia-container-runtime || true",
                marker("keyring"),
                f"if [ -f {TOOLKIT_KEYRING} ] && command -v gpg >/dev/null 2>&1; then "
                f"{primary_fingerprints(TOOLKIT_KEYRING)}; fi",
                f"if [ -f {TOOLKIT_LIST} ]; then {marker('list')}; cat {TOOLKIT_LIST}; fi",
            ]
        )

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
