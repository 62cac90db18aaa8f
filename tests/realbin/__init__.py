"""Real containerd binaries from Debian's archive, fetched and unpacked into a cache outside the repo."""
