"""`rampmeter serve --policy FILE --upstream URL`: the flag names the servers, the file says how they behave.

Found by bench/real_servers: --upstream replaced [[upstreams]] whole, so the calibrated
stops_on_cancel and timeout_s were silently dropped and the sidecar ran on "auto".
"""

from __future__ import annotations

import logging

from proxy.cli import build_parser
from proxy.serve import resolve_policy

POLICY = """
[[upstreams]]
url = "http://127.0.0.1:8000"
stops_on_cancel = true
timeout_s = 42.0

[[upstreams]]
url = "http://127.0.0.1:8001"
"""


def resolved(tmp_path, *flags: str):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    args = build_parser().parse_args(["serve", "--policy", str(path), *flags])
    return resolve_policy(args)[0]


def test_an_upstream_the_file_names_keeps_its_settings(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rampmeter"):
        policy = resolved(tmp_path, "--upstream", "http://127.0.0.1:8000/")
    (upstream,) = policy.upstreams
    assert (upstream.stops_on_cancel, upstream.timeout_s, upstream.protocol) == (True, 42.0, "http1")
    assert "http://127.0.0.1:8001 and its settings not used" in caplog.text  # the one no flag names


def test_a_new_upstream_gets_the_defaults_and_the_protocol_flag_applies(tmp_path):
    policy = resolved(tmp_path, "--upstream", "http://127.0.0.1:9000", "--upstream-protocol", "h2c")
    (upstream,) = policy.upstreams
    assert (upstream.url, upstream.protocol, upstream.stops_on_cancel) == ("http://127.0.0.1:9000", "h2c", "auto")
