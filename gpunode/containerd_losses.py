"""Settings a node's config files set for the CRI plugin that containerd's merged config does not have (no I/O).

containerd drops a file's settings without an error in several ways: on 1.x the last file with a CRI table
owns the whole plugin; on 2.0-2.2 a file whose ``version`` differs from the merged tree's loses its keys
(a version 2 root under a version 3 drop-in); on 2.3.5+ and 2.4 files of another version are migrated and
merged, and a setting may still come out other than written. Whoever wrote the files, the merged config
(``containerd config dump``) is what the daemon runs: every key a file sets that the dump shows with another
value is named, with the file and both values.
"""

from __future__ import annotations

from typing import Any

from pyinfra_gpunode.containerd_dropin import CRI_V2, CRI_V3_IMAGES, CRI_V3_RUNTIME, flatten
from pyinfra_gpunode.containerd_dump import cri_tables, normal_value
from pyinfra_gpunode.containerd_files import ConfigFile, parsed
from pyinfra_gpunode.go_duration import parsed_duration
from pyinfra_gpunode.redaction import shown

# Keys containerd 2.x moves on migration, a file's value then found in another key of the dump:
# cni.bin_dir becomes an entry of cni.bin_dirs (the dump keeps bin_dir = '').
_MOVED = {"cni.bin_dir": "cni.bin_dirs"}


def _same(key: str, written: Any, merged: Any) -> bool:
    """Whether the dump's value is the file's as containerd reads it: an empty runtime_type/sandbox_mode is
    what it fills in, and a duration is printed in Go's own form ("4h" as "4h0m0s")."""
    if normal_value(key, written) == normal_value(key, merged):
        return True
    if not (isinstance(written, str) and isinstance(merged, str)):
        return False
    read = parsed_duration(written)[0]
    return read is not None and read == parsed_duration(merged)[0]


def _written(files: list[ConfigFile]) -> dict[str, tuple[str, Any]]:
    """Every CRI key the files set (dotted within its plugin table, any schema's name), from the last file
    in load order that sets it; within a file a version 3 name over a version 2 one, as containerd 2.x
    reads it."""
    values: dict[str, tuple[str, Any]] = {}
    for config in files:
        plugins = parsed(config).get("plugins")
        if not isinstance(plugins, dict):
            continue
        for name in (CRI_V2, CRI_V3_RUNTIME, CRI_V3_IMAGES):
            table = plugins.get(name)
            if isinstance(table, dict):
                values.update((key, (config["path"], value)) for key, value in flatten(table).items())
    return values


def lost_settings(dump: dict[str, Any], files: list[ConfigFile]) -> list[str]:
    """What the files (``load_order``) set for the CRI plugin that the merged config ``dump`` has with another
    value: one line per key, naming the file and both values (credentials redacted). A key the dump does not
    print (renamed by a migration, or unknown to this containerd) is not judged."""
    merged: dict[str, Any] = {}
    for table in cri_tables(dump).values():
        merged.update(flatten(table))
    lost = []
    for key, (path, value) in sorted(_written(files).items()):
        if key in _MOVED and value in (merged.get(_MOVED[key]) or []):
            continue
        if key not in merged or _same(key, value, merged[key]):
            continue
        lost.append(
            f"{key} = {shown(key, value)} in {path}, but containerd's merged config has {shown(key, merged[key])}"
        )
    return lost
