"""Project contracts: docstrings, the guide's links and host-data table, packaging of the templates."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import FactBase

import pyinfra_gpunode.facts
import pyinfra_gpunode.operations
from pyinfra_gpunode.hostdata import KEYS, HostDataError, markdown_table, validate
from tests.packaging import InstalledWheel

REPO = Path(__file__).resolve().parents[2]


def _modules(package):
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{package.__name__}.{info.name}")


OPERATIONS = [
    (module.__name__, name, obj)
    for module in _modules(pyinfra_gpunode.operations)
    for name, obj in vars(module).items()
    if callable(obj) and hasattr(obj, "_inner") and obj.__module__ == module.__name__
]
FACTS = [
    (module.__name__, name, obj)
    for module in _modules(pyinfra_gpunode.facts)
    for name, obj in vars(module).items()
    if inspect.isclass(obj) and issubclass(obj, FactBase) and obj.__module__ == module.__name__
]


@pytest.mark.parametrize(("module", "name", "op"), OPERATIONS, ids=[f"{m}.{n}" for m, n, _ in OPERATIONS])
def test_operation_docstrings_match_signatures(module: str, name: str, op) -> None:
    doc = inspect.getdoc(op._inner) or ""
    documented = re.findall(r"^\+ (\w+):", doc, re.M)
    assert documented == list(inspect.signature(op._inner).parameters), f"{module}.{name}"
    assert ".. code:: python" in doc, f"{module}.{name} has no example"


@pytest.mark.parametrize(("module", "name", "fact"), FACTS, ids=[f"{m}.{n}" for m, n, _ in FACTS])
def test_fact_docstrings_show_a_value(module: str, name: str, fact) -> None:
    doc = inspect.getdoc(fact) or ""
    assert doc.startswith("Returns"), f"{module}.{name}"
    assert ".. code:: python" in doc, f"{module}.{name}"


def test_host_data_doc_table_matches_the_keys() -> None:
    page = (REPO / "docs" / "host-data.md").read_text()
    table = page.split("<!-- host-data table", 1)[1].split("-->", 1)[1].split("<!-- end host-data table -->")[0]
    assert table.strip() == markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| `gpunode_")]
    assert sorted(row.split("`")[1] for row in rows) == sorted(KEYS), "each key in exactly one group's table"


GUIDE = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")


def _prose(text: str) -> list[str]:
    """The lines of a Markdown ``text`` outside fenced code blocks, with inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def heading_anchors(text: str) -> set[str]:
    """The ``#anchor`` of each heading as GitHub makes it: lower case, punctuation dropped, spaces to
    ``-``, a repeated one suffixed ``-1``, ``-2``, ..."""
    anchors: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            candidate, count = slug, 0
            while candidate in anchors:
                count += 1
                candidate = f"{slug}-{count}"
            anchors.add(candidate)
    return anchors


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file, or ``#anchor`` heading in it, does not exist."""
    broken = []
    for line in _prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif anchor and (linked.suffix != ".md" or anchor not in heading_anchors(linked.read_text())):
                broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", GUIDE, ids=[page.name for page in GUIDE])
def test_relative_links_in_the_guide_resolve(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_a_missing_file_or_heading_is_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `deploys/x.py`: two, words\n\n## Same\n\n## Same\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[fine](other.md), [fine](other.md#the-deploysxpy-two-words), [fine](other.md#same-1),"
        " [fine](#page), [web](https://example.org/x#y), `[code](gone.md)`\n\n```\n[fenced](gone.md)\n```\n"
        "[gone](gone.md) and [no heading](other.md#nothing) and [no heading](#same-2)\n"
    )
    assert [link.split(":")[0] for link in broken_links(page)] == ["gone.md", "other.md#nothing", "#same-2"]


def test_each_page_of_the_docs_has_a_title_and_links_back_to_the_guide() -> None:
    for page in GUIDE[1:]:
        title, blank, first = page.read_text().splitlines()[:3]
        assert title.startswith("# ") and not blank, page.name
        assert "[README.md](../README.md)" in first, page.name


def test_host_data_defaults_are_valid_and_bad_values_are_named() -> None:
    values = validate({})
    assert set(values) == set(KEYS)
    with pytest.raises(HostDataError, match="gpunode_containerd_restart"):
        validate({"gpunode_containerd_restart": "sometimes"})
    with pytest.raises(HostDataError, match="unknown host-data key 'gpunode_nvidia_runtime'"):
        validate({"gpunode_nvidia_runtime": "/x"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gpunode_toolkit_version", "1.17.8-1\n"),  # would split the apt-get install command
        ("gpunode_toolkit_version", "1.17.8-1\u0085"),  # a C1 control character
        ("gpunode_driver_version", "580.126.20\n"),
        ("gpunode_driver_branch", "580\n"),
        ("gpunode_unattended_blacklist", ["linux-", "nvidia-\n"]),  # would silently drop the entry
        ("gpunode_needrestart_keep", ["containerd\r"]),
        ("gpunode_nvidia_runtime_binary", "/usr/bin/nvidia-container-runtime\n"),
        ("gpunode_cdi_spec_dirs", ["/etc/cdi", "/var/run/cdi\x00"]),
        ("gpunode_rollout_order", ["node1\tnode2"]),
        ("gpunode_toolkit_deb_dir", "/srv/debs\x1b[2J"),
    ],
)
def test_host_data_strings_refuse_control_characters(key: str, value: object) -> None:
    with pytest.raises(HostDataError, match=rf"'{key}' must not contain newlines or control characters, got .*<U\+00"):
        validate({key: value})
    message = ""
    try:
        validate({key: value})
    except HostDataError as error:
        message = str(error)
    assert "\\" not in message  # a shell's echo would turn a backslash sequence into the character again


def test_restart_timeout_is_bounded() -> None:
    assert validate({"gpunode_restart_timeout": 3600})["gpunode_restart_timeout"] == 3600
    for bad in (3601, 0, -5, True, "60"):
        with pytest.raises(HostDataError, match=f"'gpunode_restart_timeout' must be int, 1 to 3600, got {bad!r}"):
            validate({"gpunode_restart_timeout": bad})


def test_reboot_timeout_is_bounded() -> None:
    assert validate({})["gpunode_reboot_timeout"] == 600
    assert validate({"gpunode_reboot_timeout": 7200})["gpunode_reboot_timeout"] == 7200
    assert validate({"gpunode_reboot_timeout": 60})["gpunode_reboot_timeout"] == 60
    for bad in (59, 7201, 0, True, 600.5, "600", None):
        with pytest.raises(HostDataError, match=f"'gpunode_reboot_timeout' must be int, 60 to 7200, got {bad!r}"):
            validate({"gpunode_reboot_timeout": bad})


def test_numbers_from_the_command_line_where_unambiguous() -> None:
    """``--data k=580`` parses to an int: its digits are the text; a float has lost its text."""
    values = validate({"gpunode_driver_branch": 580, "gpunode_driver_version": 580, "gpunode_toolkit_version": 1})
    assert (values["gpunode_driver_branch"], values["gpunode_driver_version"]) == ("580", "580")
    assert values["gpunode_toolkit_version"] == "1"
    with pytest.raises(HostDataError, match="'gpunode_driver_branch' must be str or null, got '5800'"):
        validate({"gpunode_driver_branch": 5800})
    for key in ("gpunode_driver_version", "gpunode_toolkit_version", "gpunode_driver_branch"):
        with pytest.raises(HostDataError, match=rf"'{key}' .* got the number 580\.1, .* quote it.*--data '{key}="):
            validate({key: 580.10})
    for key, value in [("gpunode_driver_branch", True), ("gpunode_driver_flavor", 1), ("gpunode_cdi_spec_path", 1),
                       ("gpunode_allow_dkms", 1), ("gpunode_unattended_blacklist", "linux-")]:  # fmt: skip
        with pytest.raises(HostDataError, match=f"'{key}' must be"):
            validate({key: value})


def test_editable_install_finds_templates_in_the_checkout() -> None:
    templates = importlib.import_module("pyinfra_gpunode.templates.containerd")
    assert Path(templates.__file__).resolve().parent == REPO / "templates" / "containerd"


def test_wheel_ships_templates_and_renders(installed_wheel: InstalledWheel, tmp_path: Path) -> None:
    target = installed_wheel.site
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import pyinfra_gpunode.containerd_dropin as d, pyinfra_gpunode.templates.containerd as t; "
        "from pyinfra_gpunode.versions import parse_containerd_version as v; "
        "r = d.plan('/etc/containerd/config.toml', {}, v('containerd x 1.7.24 y'), d.Options()); "
        "print(t.__file__); print(r.dropin_text.splitlines()[0])"
    )
    # Run outside the checkout so the repository's folders cannot shadow the wheel.
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(target)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    template_file, first_line = done.stdout.splitlines()
    assert template_file.startswith(str(target))
    assert first_line.startswith("# Managed by pyinfra-gpunode")


@pytest.mark.parametrize("name", ["example.py"])  # vagrant.py needs running VMs
def test_shipped_inventories_pass_host_data_validation(name: str) -> None:
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from pyinfra_gpunode.rollout import rollout_order

    with ctx_state.use(State()):
        inventory = make_inventory(str(REPO / "inventories" / name), cwd=str(REPO))
    hosts = list(inventory)
    assert hosts
    for host in hosts:
        values = validate(host.data.dict())
        rollout_order([other.name for other in hosts], values["gpunode_rollout_order"])
        assert host.data.get("ssh_strict_host_key_checking") == "yes", host.name
