"""containerd's config files as containerd itself loads them (no I/O).

The main config is read first, then its ``imports`` in the order listed; each entry is a Go
``filepath.Glob`` (byte order), relative entries resolve against the importing file's
directory, imports of imported files are appended breadth-first, and a file already loaded is
skipped. Later files win.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from typing import Any, TypedDict

from pyinfra_gpunode import node_toml
from pyinfra_gpunode.memo import by_content

CONFIG_ROOT = "/etc/containerd"
_GLOB_META = re.compile(r"[*?\[]")
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
# What containerd does with an ``imports`` entry naming a missing file (not a glob), as Debian's 1.6.20,
# 1.7.24 and 2.1.9 do it: the daemon exits before it loads any plugin.
MISSING_IMPORT_EFFECT = "containerd exits at start (open ...: no such file or directory), before any plugin loads"


class ConfigFile(TypedDict):
    path: str
    version: int | None
    imports: list[str]
    plugins: list[str]
    error: str | None
    text: str


class ConfigTree(TypedDict):
    main: ConfigFile | None
    main_path: str
    imported: list[ConfigFile]
    problems: list[str]


class MissingImport(TypedDict):
    """A file an ``imports`` entry names by its path (not a glob) that is not on the node."""

    importer: str  # the file whose ``imports`` names it
    entry: str  # the entry as written (relative entries resolve against the importer's directory)
    path: str


def parse_config_file(path: str, text: str) -> ConfigFile:
    """Parse one config file: its ``version``, ``imports`` and top-level plugin keys.

    Bytes that are not UTF-8 arrive as surrogate escapes (``errors="surrogateescape"``); such a
    file is an error naming the first of them, and its text is not kept.
    """
    bad = _NOT_UTF8.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        reason = f"not UTF-8: byte 0x{ord(bad.group()) - 0xDC00:02x} on line {line}"
        return {"path": path, "version": None, "imports": [], "plugins": [], "error": reason, "text": ""}
    try:
        data = toml_data(text)
    except tomllib.TOMLDecodeError as exc:
        return {"path": path, "version": None, "imports": [], "plugins": [], "error": str(exc), "text": text}
    version = data.get("version")
    imports = data.get("imports", [])
    error = None
    if version is not None and not isinstance(version, int):
        error = f"key 'version' must be an integer, got {version!r}"
        version = None
    if not isinstance(imports, list) or not all(isinstance(item, str) for item in imports):
        error = f"key 'imports' must be a list of strings, got {imports!r}"
        imports = []
    plugins = data.get("plugins", {})
    return {
        "path": path,
        "version": version,
        "imports": imports,
        "plugins": sorted(plugins) if isinstance(plugins, dict) else [],
        "error": error,
        "text": text,
    }


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Go ``filepath.Match`` semantics: ``*`` and ``?`` never match ``/``; ``[^…]`` negates."""
    out = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("^"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out) + r"\Z")


def expand_import(entry: str, importer: str, existing: list[str]) -> list[str]:
    """The files one ``imports`` entry names, in containerd's order."""
    path = entry if entry.startswith("/") else posixpath.join(posixpath.dirname(importer), entry)
    path = posixpath.normpath(path)
    if not _GLOB_META.search(path):
        return [path]
    regex = _glob_regex(path)
    return sorted((p for p in existing if regex.match(p)), key=lambda p: p.encode())


def _inside(entry: str, importer: str, root: str = CONFIG_ROOT) -> bool:
    path = entry if entry.startswith("/") else posixpath.join(posixpath.dirname(importer), entry)
    return posixpath.normpath(path).startswith(root + "/")


@by_content  # a fleet's nodes carry the same files; each node's steps resolve its tree several times
def resolve_tree(main_path: str, texts: dict[str, str], root: str = CONFIG_ROOT) -> ConfigTree:
    """Walk the main config's imports breadth-first over the files in ``texts``.

    ``texts`` maps every readable ``*.toml`` under ``root`` (``/etc/containerd``; ``/etc/k0s`` on a
    k0s node) and the main config to its content. A missing main config is a valid state
    (containerd's defaults apply).
    """
    return _walk(main_path, texts, root)[0]


def missing_imports(main_path: str, texts: dict[str, str], root: str = CONFIG_ROOT) -> list[MissingImport]:
    """The files ``imports`` entries of the tree name by path (not by a glob) that are not in ``texts``.

    Only a ``*.toml`` path under ``root`` counts: ``texts`` holds every such file there is, so one not in
    it does not exist. containerd 1.6, 1.7 and 2.x exit at start on such an entry; a glob matching
    nothing is no error to them.
    """
    return _walk(main_path, texts, root)[1]


def missing_import_text(missing: MissingImport) -> str:
    """``missing`` in words: the importing file, its key, the entry and the path it names."""
    entry = "" if missing["entry"] == missing["path"] else f"entry {missing['entry']!r} "
    return f"{missing['importer']}: key 'imports' {entry}names {missing['path']}, which does not exist"


def _walk(main_path: str, texts: dict[str, str], root: str) -> tuple[ConfigTree, list[MissingImport]]:
    problems: list[str] = []
    missing: list[MissingImport] = []
    if main_path not in texts:
        return {"main": None, "main_path": main_path, "imported": [], "problems": problems}, missing
    main = parse_config_file(main_path, texts[main_path])
    existing = sorted(texts)
    imported: list[ConfigFile] = []
    loaded = {main_path}
    pending = [(entry, main) for entry in main["imports"]]
    while pending:
        entry, importer = pending.pop(0)
        paths = expand_import(entry, importer["path"], existing)
        if not all(path.startswith(root + "/") for path in paths) or not _inside(entry, importer["path"], root):
            problems.append(f"{importer['path']}: key 'imports' entry {entry!r} is outside {root}")
            continue
        for path in paths:
            if path in loaded:
                continue
            if path not in texts:
                if path.endswith(".toml"):
                    missing.append({"importer": importer["path"], "entry": entry, "path": path})
                    problems.append(f"{missing_import_text(missing[-1])}: {MISSING_IMPORT_EFFECT}")
                else:
                    problems.append(
                        f"{importer['path']}: key 'imports' names {path}, which gpunode does not read "
                        f"(it reads the *.toml files under {root}); rename it to end in .toml"
                    )
                continue
            loaded.add(path)
            config = parse_config_file(path, texts[path])
            imported.append(config)
            pending += [(sub, config) for sub in config["imports"]]
    return {"main": main, "main_path": main_path, "imported": imported, "problems": problems}, missing


def load_order(tree: ConfigTree) -> list[ConfigFile]:
    """Every file containerd reads, main config first."""
    return ([tree["main"]] if tree["main"] else []) + tree["imported"]


def parsed(config: ConfigFile) -> dict[str, Any]:
    """The file's content as data (empty for a file that does not parse)."""
    if config["error"]:
        return {}
    return toml_data(config["text"])


def toml_data(text: str) -> dict[str, Any]:
    """``node_toml.loads(text)``: a fresh copy each time of a text parsed once per process (a run reads each
    node's files in several steps, and many nodes share one text)."""
    return node_toml.loads(text)


def strictest_mode(modes: list[str], base: str = "644") -> str:
    """The permission bits every one of ``modes`` (octal, as ``stat -c %a`` prints them) allows, within ``base``."""
    bits = int(base, 8) & 0o777
    for mode in modes:
        bits &= int(mode, 8) & 0o777
    return f"{bits:o}"


def links_in_the_way(paths: list[str], links: dict[str, str]) -> list[str]:
    """Symbolic links at, or in a directory above, the files we would write (``links``: path -> target)."""
    found = []
    for path in paths:
        parts = path.split("/")
        for depth in range(2, len(parts) + 1):
            candidate = "/".join(parts[:depth])
            if candidate in links and candidate not in found:
                found.append(candidate)
    return [f"{link} is a symbolic link to {links[link]}" for link in found]


def not_regular_files(paths: list[str], kinds: dict[str, str]) -> list[str]:
    """Paths we would write that are not regular files, or that have a directory above them that is not a directory.

    ``kinds`` maps an existing path to its file type as ``stat -c %F`` prints it; a missing path is
    not in it (it is created).
    """
    found = []
    for path in paths:
        parts = path.split("/")
        for depth in range(2, len(parts) + 1):
            candidate = "/".join(parts[:depth])
            wanted = ("regular file", "regular empty file") if candidate == path else ("directory",)
            kind = kinds.get(candidate)
            message = f"{candidate} is a {kind}, not a {wanted[0]}"
            if kind is not None and kind not in wanted and message not in found:
                found.append(message)
    return found


# containerd v2.3.0-v2.3.4 (containerd PR 12891, reverted by PR 13939 for v2.3.5 and 2.4): the error names
# versions only.
_SKEW = re.compile(r"drop-in config version ([0-9]+) higher than root config version ([0-9]+)")


def version_skew_files(error: str, files: list[ConfigFile]) -> str | None:
    """Where containerd's own error refuses a drop-in newer than the root file, which files it means (the
    error names only their versions) and the way out; ``None`` for any other error."""
    match = _SKEW.search(error)
    if not match or not files:
        return None
    root = files[0]
    newer = [config["path"] for config in files[1:] if (config["version"] or 0) > (root["version"] or 0)]
    return (
        f"{', '.join(newer) or 'a drop-in'} {'has' if len(newer) < 2 else 'have'} a version above {root['path']}'s "
        f"version = {match.group(2)}: give each drop-in the root file's version, or move to containerd 2.3.5 or "
        "later, which migrates such a file and merges it"
    )
