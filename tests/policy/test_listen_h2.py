"""The [listen] keys that bound one HTTP/2 client: ranges, and the one rule relating them."""

from __future__ import annotations

import pytest

from proxy.errors import PolicyError
from proxy.policy.load import parse_policy


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.toml")
    return info.value.errors


def test_the_body_bound_of_a_connection_holds_at_least_one_body():
    (error,) = errors_of("[listen]\nmax_body_bytes = 2000000\nh2_body_bytes_per_connection = 1000000\n")
    assert "listen.h2_body_bytes_per_connection: must be at least listen.max_body_bytes" in error, error
    assert parse_policy("[listen]\nmax_body_bytes = 1000000\nh2_body_bytes_per_connection = 1000000\n")


@pytest.mark.parametrize(
    "line",
    [
        "h2_control_frame_burst = 1",
        "h2_reset_burst = 0",
        "h2_send_timeout_s = 0",
        "body_timeout_s = 0",
        "h2_connection_window_bytes = 1000",
        "h2_send_buffer_bytes = 1000",
    ],
)
def test_nonsense_bounds_are_refused_naming_the_key(line):
    (error,) = errors_of(f"[listen]\n{line}\n")
    assert line.split(" ")[0] in error, error
