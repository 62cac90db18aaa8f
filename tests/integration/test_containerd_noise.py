"""containerd's own noise is not a change: each kind of warning, from the real binaries themselves.

The candidate check (``candidate_losses``) refuses a candidate tree that makes containerd warn where the
node's tree does not. What containerd prints of itself must not count: the time each line is stamped with
(every version), the ``t=`` duration of containerd 2.3+'s migration notice (one per version 2 or 3 file), and
the row of a key that our imports line moved down; while a warning the candidate really adds still does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyinfra_gpunode.containerd_dropin import OUR_DROPIN, Options, plan, staged_imports
from pyinfra_gpunode.containerd_dump import candidate_losses, expected_warning, new_warnings, runc_runtime, warning_text
from pyinfra_gpunode.facts.containerd import (
    ContainerdCandidateDump,
    ContainerdConfigDump,
    ContainerdConfigFiles,
    ContainerdVersion,
    candidate_input,
)
from tests.realbin.namespace import ScenarioHost
from tests.realbin.scenarios import CONFIG, UPSTREAM, debian_config

pytestmark = pytest.mark.containerd
BINARY = "/usr/bin/nvidia-container-runtime"
MIGRATED = "Configuration migrated from version 2, use `containerd config migrate` to avoid migration"


def staged(host: ScenarioHost, dropin_extra: str = "") -> tuple[dict, dict, object]:
    """The node's dump, the planned candidate's staged dump (our drop-in plus ``dropin_extra``) and the plan."""
    before = host.fact(ContainerdConfigDump)
    files = host.fact(ContainerdConfigFiles)
    result = plan(
        files["main_path"], files["texts"], host.fact(ContainerdVersion), Options(), runc_runtime(before["dump"])
    )
    assert not result.errors, result.errors
    after = host.fact(
        ContainerdCandidateDump,
        config_path=CONFIG,
        dropin_path=OUR_DROPIN,
        _stdin=candidate_input(staged_imports(result.config_text), result.dropin_text + dropin_extra),
    )
    assert after["error"] is None, after["error"]
    return before, after, result


def losses(before: dict, after: dict, result) -> list[str]:
    return candidate_losses(
        before["dump"], after["dump"], before["warnings"], after["warnings"], result.intended, BINARY, result.user_set
    )


@pytest.mark.parametrize("version", UPSTREAM)
def test_migration_notice_of_23_and_24_is_expected_not_new(tmp_path: Path, version: str) -> None:
    """Debian's version 2 config.toml as an upgrade leaves it: 2.3+ warns once per file, its ``t=`` differing
    on every run; our version 2 drop-in adds a second notice. The candidate registers."""
    host = ScenarioHost(tmp_path, version)
    host.write(CONFIG, debian_config(version))
    raw = [host.sh(f"containerd --config {CONFIG} config dump >/dev/null").stderr for _ in range(2)]
    assert all(MIGRATED in text and ' t="' in text for text in raw), raw
    assert raw[0] != raw[1]  # the binary's own lines differ from run to run
    assert {warning_text(text.strip()) for text in raw} == {f'level=warning msg="{MIGRATED}"'}

    before, after, result = staged(host)
    assert [warning for warning in after["warnings"] if MIGRATED in warning] == [f'level=warning msg="{MIGRATED}"'] * 2
    assert all(expected_warning(warning) for warning in after["warnings"])
    assert losses(before, after, result) == []


@pytest.mark.parametrize("version", ["2.1.9", *UPSTREAM])
def test_a_warning_the_node_has_already_is_not_new_though_its_row_moved(tmp_path: Path, version: str) -> None:
    """An unknown key below config.toml's first table: our imports line goes above that table, so 2.x's
    "Ignoring unknown key in TOML" names another row for the same key."""
    host = ScenarioHost(tmp_path, version)
    host.write(CONFIG, "version = 2\n\n[grpc]\n  bogus_key = 1\n")
    before, after, result = staged(host)
    (node_warning,) = [warning for warning in before["warnings"] if "bogus_key" in warning]
    (candidate_warning,) = [warning for warning in after["warnings"] if "bogus_key" in warning]
    assert "row" not in node_warning and node_warning == candidate_warning
    dump = f"containerd --config {CONFIG} config dump >/dev/null"
    node_row = host.sh(dump).stderr
    host.write(CONFIG, result.config_text)
    host.write(OUR_DROPIN, result.dropin_text)
    written_row = host.sh(dump).stderr
    assert "row=4" in node_row and "row=5" in written_row, (node_row, written_row)  # the binary's own rows
    assert new_warnings(before["warnings"], after["warnings"]) == []
    assert losses(before, after, result) == []


@pytest.mark.parametrize("version", ["2.1.9", *UPSTREAM])
def test_a_warning_the_candidate_adds_is_still_refused(tmp_path: Path, version: str) -> None:
    """The check still bites: a key no containerd knows, added by the candidate's drop-in (1.7 warns of none)."""
    host = ScenarioHost(tmp_path, version)
    host.write(CONFIG, debian_config(version))
    before, after, result = staged(host, "\n[debug]\n  no_such_debug_key = true\n")
    found = losses(before, after, result)
    assert any(loss.startswith("new warning: ") and "no_such_debug_key" in loss for loss in found), found
