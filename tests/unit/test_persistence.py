"""Persistence mode: asked by host data and the node's GPUs, brought about by one systemctl verb, and
judged from systemd's word on nvidia-persistenced and NVML's on each GPU."""

from __future__ import annotations

import pytest

from pyinfra_gpunode.persistence import readiness_problem, unit_change, wanted

H100, VGA = "0x030200", "0x030000"
RUNNING = {"load": "loaded", "active": "active", "enabled": "enabled"}


def test_auto_asks_it_on_for_datacenter_gpus_only() -> None:
    assert wanted("auto", [H100]) is True
    assert wanted("auto", [VGA]) is False
    assert wanted("auto", [VGA, H100]) is True
    assert wanted("on", [VGA]) is True and wanted("off", [H100]) is False
    assert wanted("on", []) is None  # no GPU: nothing asked


@pytest.mark.parametrize(
    ("want", "unit", "expected"),
    [
        (True, {"load": "loaded", "active": "inactive", "enabled": "disabled"}, ("enable", None)),
        (True, {"load": "loaded", "active": "failed", "enabled": "enabled"}, ("enable", None)),
        (True, RUNNING, (None, None)),
        (False, RUNNING, ("disable", None)),
        (False, {"load": "loaded", "active": "inactive", "enabled": "disabled"}, (None, None)),
        (False, {"load": "not-found", "active": "inactive", "enabled": "not-found"}, (None, None)),
    ],
)
def test_one_verb_brings_the_unit_where_asked(want: bool, unit: dict, expected: tuple) -> None:
    assert unit_change(want, unit) == expected


def test_a_unit_that_cannot_be_brought_about_is_named() -> None:
    missing = unit_change(True, {"load": "not-found", "active": "inactive", "enabled": "not-found"})
    assert missing[0] is None and "nvidia-persistenced.service is not installed" in (missing[1] or "")
    masked = unit_change(True, {"load": "masked", "active": "inactive", "enabled": "masked"})
    assert masked == (None, "nvidia-persistenced.service is masked: unmask it to turn persistence mode on")
    image = unit_change(True, {"load": None, "active": None, "enabled": "enabled"})  # a chroot: no systemd runs
    assert image[0] is None and "systemd does not run on this node" in (image[1] or "")
    assert unit_change(True, None)[0] is None


def test_the_report_judges_systemd_s_word_then_nvml_s() -> None:
    assert readiness_problem(True, RUNNING, [{"index": 0, "persistence_mode": True}]) is None
    assert readiness_problem(True, {**RUNNING, "active": "failed"}, []) == (
        "persistence mode is asked on, but nvidia-persistenced.service is failed"
    )
    assert readiness_problem(True, {"load": "not-found", "active": "inactive", "enabled": "not-found"}, []) == (
        "persistence mode is asked on, but nvidia-persistenced.service is not installed"
    )
    devices = [{"index": 0, "persistence_mode": True}, {"index": 1, "persistence_mode": False}]
    assert readiness_problem(True, RUNNING, devices) == (
        "persistence mode is asked on, but NVML reports it off on GPU(s) 1"
    )
    assert readiness_problem(True, {"load": None, "active": None, "enabled": "enabled"}, []) is None  # a chroot
    assert readiness_problem(False, None, devices) is None and readiness_problem(None, None, devices) is None
    assert readiness_problem(True, RUNNING, [{"index": 0}]) is None  # NVML did not say
