"""Settings the files write that containerd's merged config has otherwise (pure): values compared as containerd
reads them."""

from __future__ import annotations

from pyinfra_gpunode.containerd_files import parse_config_file
from pyinfra_gpunode.containerd_losses import lost_settings
from pyinfra_gpunode.go_duration import parsed_duration

CRI = "io.containerd.grpc.v1.cri"


def files(body: str) -> list:
    return [parse_config_file("/etc/containerd/config.toml", f'version = 2\n[plugins."{CRI}"]\n{body}')]


def dump(table: dict) -> dict:
    return {"version": 2, "plugins": {CRI: table}}


def test_a_duration_in_gos_own_form_is_the_files_value_and_another_is_not() -> None:
    written = files('  stream_idle_timeout = "4h"\n')
    assert lost_settings(dump({"stream_idle_timeout": "4h0m0s"}), written) == []
    assert lost_settings(dump({"stream_idle_timeout": "30m0s"}), written) == [
        "stream_idle_timeout = '4h' in /etc/containerd/config.toml, but containerd's merged config has '30m0s'"
    ]


def test_an_empty_runtime_type_is_what_containerd_fills_in_and_a_plain_string_is_compared_as_is() -> None:
    written = files('  sandbox_image = "pause:3.9"\n  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                    '    runtime_type = ""\n')  # fmt: skip
    merged = dump(
        {"sandbox_image": "pause:3.10", "containerd": {"runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2"}}}}
    )
    assert lost_settings(merged, written) == [
        "sandbox_image = 'pause:3.9' in /etc/containerd/config.toml, but containerd's merged config has 'pause:3.10'"
    ]


def test_go_durations_parse_as_go_reads_them() -> None:
    assert parsed_duration("4h0m0s") == parsed_duration("4h") == (4 * 3600 * 10**9, None)
    assert parsed_duration("1.5s") == (1_500_000_000, None)
    assert parsed_duration("-2m") == (-120 * 10**9, None)
    assert parsed_duration("0") == (0, None)
    assert parsed_duration("forever") == (None, 'time: invalid duration "forever"')
    assert parsed_duration("5") == (None, 'time: missing unit in duration "5"')
