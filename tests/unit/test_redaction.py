"""Credentials stay out of plans and messages in every TOML form; other values still show."""

from __future__ import annotations

import tomllib

import pytest

from pyinfra_gpunode.containerd_dump import candidate_losses
from pyinfra_gpunode.operations.containerd import Registration
from pyinfra_gpunode.redaction import is_secret_name, redacted, shown

CRI = '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
# One case per TOML form: the text after ``version = 2`` and the CRI registry table, and its secrets.
FORMS = {
    "inline tables": ('  configs = { "r" = { auth = { password = "inl-PASS-1" } } }\n', ["inl-PASS-1"]),
    "dotted keys": (
        '  configs."r".auth.password = "dot-PASS-2"\n  x.identitytoken = "dot-TOKEN-3"\n',
        ["dot-PASS-2", "dot-TOKEN-3"],
    ),
    "quoted dotted table": (
        '[plugins."io.containerd.grpc.v1.cri"."registry"."configs"."r".auth]\n  username = "quoted-USER-4"\n',
        ["quoted-USER-4"],
    ),
    "multi-line basic string": (
        '  configs."r".auth.password = """\nml-LINE-5\nml-LINE-6"""\n  configs."r".auth.username = "u"\n',
        ["ml-LINE-5", "ml-LINE-6"],
    ),
    "multi-line literal string": (
        "  configs.\"r\".auth.identitytoken = '''lit-LINE-7\n  lit-LINE-8\n'''\n",
        ["lit-LINE-7", "lit-LINE-8"],
    ),
    "arrays": (
        '  auths = ["arr-SECRET-9", "arr-SECRET-10"]\n  tokens = [\n    "arr-TOKEN-11",\n  ]\n',
        ["arr-SECRET-9", "arr-SECRET-10", "arr-TOKEN-11"],
    ),
    "array of inline tables": ('  mirrorlist = [{ host = "m", password = "aot-PASS-12" }]\n', ["aot-PASS-12"]),
    "headers table": (
        '[plugins."io.containerd.grpc.v1.cri".registry.headers]\n  X-Registry-Token = ["hdr-TOKEN-13"]\n'
        '  X-Meta-Source = ["hdr-VALUE-14"]\n',
        ["hdr-TOKEN-13", "hdr-VALUE-14"],
    ),
    "inline headers": ('  headers = { "X-Registry-Token" = ["hdr-TOKEN-15"] }\n', ["hdr-TOKEN-15"]),
    "key named like a secret": (
        '  client_secret = "sec-16"\n  api-key = "key-17"\n  passwd = "pw-18"\n',
        ["sec-16", "key-17", "pw-18"],
    ),
}


def config(form: str) -> str:
    return "version = 2\n" + CRI + FORMS[form][0]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_is_redacted_and_other_values_still_show(form: str) -> None:
    text = config(form)
    tomllib.loads(text)  # a valid config
    shown_text = redacted(text)
    for secret in FORMS[form][1]:
        assert secret not in shown_text, shown_text
    assert "<redacted>" in shown_text
    assert 'config_path = "/etc/containerd/certs.d"' in shown_text
    assert "version = 2" in shown_text


@pytest.mark.parametrize("form", FORMS)
def test_plan_diff_shows_no_credential_in_any_form(form: str) -> None:
    text = config(form)
    changed = text.replace('config_path = "/etc/containerd/certs.d"', 'config_path = "/etc/containerd/hosts.d"')
    path = "/etc/containerd/conf.d/50-registry.toml"
    diff = Registration(writes={path: changed}, current={path: text}).diff()
    for secret in FORMS[form][1]:
        assert secret not in diff, diff
    assert '-  config_path = "/etc/containerd/certs.d"' in diff and '+  config_path = "/etc/containerd/hosts.d"' in diff


def test_gate_messages_redact_credentials_inside_table_and_array_values() -> None:
    """The gate's loss messages name the key; a value that is itself a table or array hides its credentials."""
    before = {"plugins": {"io.containerd.grpc.v1.cri": {"registry": {"headers": {"X-Registry-Token": ["t-19"]}}}}}
    after = {"plugins": {"io.containerd.grpc.v1.cri": {"registry": {"headers": {"X-Registry-Token": ["t-20"]}}}}}
    text = "\n".join(candidate_losses(before, after, [], [], {}, "/usr/bin/nvidia-container-runtime"))
    assert "registry.headers.X-Registry-Token would change from '<redacted>' to '<redacted>'" in text
    assert "t-19" not in text and "t-20" not in text
    assert shown("registry.configs", {"r": {"auth": {"password": "p-21"}}, "s": {"tls": {"key_file": "/k"}}}) == (
        "{'r': {'auth': {'password': '<redacted>'}}, 's': {'tls': {'key_file': '/k'}}}"
    )
    assert (
        shown("registry.mirrors", [{"endpoint": "e", "token": "t-22"}]) == "[{'endpoint': 'e', 'token': '<redacted>'}]"
    )


@pytest.mark.parametrize(
    "name",
    ["password", "Passwd", "identitytoken", "auth_token", "client_secret", "credentials", "auth", "auths",
     "headers", "key", "api_key", "private-key"],
)  # fmt: skip
def test_names_like_a_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["key_file", "cert_file", "key_model", "runtime_type", "config_path", "username", "BinaryName", "endpoint",
     "io.containerd.grpc.v1.cri", "sandbox_image", "stream_idle_timeout"],
)  # fmt: skip
def test_names_not_like_a_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_text_that_is_not_toml_is_not_shown() -> None:
    assert redacted('password = """never closed\nhidden-23\n') == (
        "# not shown: not valid TOML (Unterminated string (at end of document))\n"
    )


def test_layout_kept_where_it_renders_the_same_values() -> None:
    text = version_and_comment = '# site registry\nversion = 2\n[a.auth]\n  password = "p"  # rotated monthly\n'
    assert redacted(text) == version_and_comment.replace('"p"', '"<redacted>"')


def test_a_urls_password_is_redacted_wherever_the_url_stands() -> None:
    text = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\n'
        '  endpoint = ["https://puller:s3cr3t-pw@mirror.example:5000", "https://open.example"]\n'
        '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
        'proxy = "http://u:p@proxy.example:3128/"\n'
    )
    shown_text = redacted(text)
    assert "s3cr3t-pw" not in shown_text and ":p@" not in shown_text
    assert "https://puller:<redacted>@mirror.example:5000" in shown_text and "https://open.example" in shown_text
    assert 'proxy = "http://u:<redacted>@proxy.example:3128/"' in shown_text
    assert "# " not in shown_text.splitlines()[0]  # the layout kept, not rendered afresh
    assert (
        shown("registry.mirrors.docker.io.endpoint", ["https://a:b@m.example"]) == "['https://a:<redacted>@m.example']"
    )
    assert (
        shown("x", "user@host.example and https://host.example/a:b@c")
        == "'user@host.example and https://host.example/a:b@c'"
    )
