"""Policy loading: strict keys, ranges, messages that name key and line, shipped files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy import reference
from proxy.policy.load import load_policy, parse_policy
from proxy.policy.schema import Policy

ROOT = Path(__file__).resolve().parents[2]


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.toml")
    return info.value.errors


def test_empty_policy_is_the_defaults():
    assert parse_policy("") == Policy()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[listen]\nmax_connections = 0\n", "p.toml:2: listen.max_connections: Expected `int` >= 1"),
        ("# c\n[listen]\nmax_conections = 5\n", "p.toml:3: listen.max_conections: unknown key (allowed here: address,"),
        ("bogus = 1\n", "p.toml:1: bogus: unknown key (allowed here: listen, admin, upstreams"),
        ('[admin]\naddress = "nope"\n', "p.toml:2: admin.address: expected HOST:PORT, e.g. 0.0.0.0:8080"),
        (
            '[[upstreams]]\nurl = "http://a:1"\n[[upstreams]]\nurl = "https://b"\n',
            "p.toml:4: upstreams[1].url: expected http://HOST:PORT[/prefix]",
        ),
        (
            '[[upstreams]]\nurl = "http://a:1"\nprotocol = "h3"\n',
            "p.toml:3: upstreams[0].protocol: Invalid enum value 'h3' (expected one of: 'http1', 'h2c')",
        ),
        ("upstreams = []\n", "p.toml:1: upstreams: Expected `array` of length >= 1"),
        ('[listen]\nidle_timeout_s = "10"\n', "p.toml:2: listen.idle_timeout_s: Expected `float`, got `str`"),
        ("[listen\n", "not valid TOML"),
    ],
)
def test_errors_name_the_key_and_line(text, message):
    (error,) = errors_of(text)
    assert error.startswith(message) or message in error, error


def test_unreadable_file(tmp_path):
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.toml")


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_policy_loads(path):
    assert isinstance(load_policy(path), Policy)


def test_default_toml_is_generated_from_the_schema():
    shipped = (ROOT / "policies" / "default.toml").read_text()
    assert shipped == reference.default_toml(), "run: python -m proxy.policy.reference --toml > policies/default.toml"
    assert parse_policy(shipped) == Policy()


def test_policy_reference_is_current():
    shipped = (ROOT / "docs" / "policy-reference.md").read_text()
    assert shipped == reference.markdown(), "run: make policy-docs"


def test_policy_check_cli_exit_codes(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[listen]\nmax_connections = 10\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("[listen]\nmax_connections = -1\n")
    ok = subprocess.run(
        [sys.executable, "-m", "proxy", "policy", "check", str(good)], check=False, capture_output=True, text=True
    )
    assert ok.returncode == 0 and "ok" in ok.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "proxy", "policy", "check", str(good), str(bad)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 1
    assert f"{bad}:2: listen.max_connections: Expected `int` >= 1" in failed.stderr


def test_policy_schema_cli_prints_json_schema():
    import json

    out = subprocess.run(
        [sys.executable, "-m", "proxy", "policy", "schema"], capture_output=True, text=True, check=True
    )
    schema = json.loads(out.stdout)
    listen = schema["$defs"]["Listen"]["properties"]["max_connections"]
    assert listen["minimum"] == 1 and "description" in listen


def test_a_reader_that_goes_away_gets_no_traceback():
    """`rampmeter policy schema | head -c 10`: the pipe closes early; exit 141 quietly, as Unix tools do.
    Here the reading end is closed before the command starts, so its first write finds no reader."""
    import os

    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "proxy", "policy", "schema"],
            stdout=w,
            stderr=subprocess.PIPE,
            check=False,
            timeout=60,
        )
    finally:
        os.close(w)
    assert proc.returncode == 141
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr
