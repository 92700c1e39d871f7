"""The served-paths allowlist: a prefix check that a model server's path normalisation cannot get around."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.served_paths import ServedPaths

ONLY_V1 = ServedPaths(["/v1/"])


def test_off_by_default_everything_is_served():
    off = ServedPaths([])
    assert not off.enabled
    assert off.allows(b"/metrics") and off.allows(b"/v1/../metrics") and off.allows(b"*")


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/models", b"/v1/", b"/v1/a%20b", b"/v1/x.y/..z"])
def test_plain_paths_under_a_prefix_are_served(path):
    assert ONLY_V1.allows(path)


@pytest.mark.parametrize(
    "path",
    [
        b"/metrics",
        b"/docs",
        b"/v1",  # the prefix is "/v1/"
        b"",
        b"*",
        b"/v1/../metrics",
        b"/v1/./../metrics",
        b"/v1/%2e%2e/metrics",
        b"/v1/%2E%2E/metrics",
        b"/v1/.%2e/metrics",
        b"/v1/..%2fmetrics",
        b"/v1/..%2Fmetrics",
        b"/v1/..%5cmetrics",
        b"/v1\\..\\metrics",
        b"/v1/chat/..",
        b"/%76%31/chat",  # an encoded prefix is not the prefix
    ],
)
def test_other_paths_and_escapes_are_not(path):
    assert not ONLY_V1.allows(path)


def _resolve(path: bytes) -> bytes:
    """RFC 3986 5.2.4 remove_dot_segments, after one percent-decoding: what a server may route."""
    out: list[bytes] = []
    for segment in unquote_to_bytes(path).replace(b"\\", b"/").split(b"/"):
        if segment == b"..":
            if len(out) > 1:
                out.pop()
        elif segment != b".":
            out.append(segment)
    return b"/".join(out)


@given(
    st.lists(
        st.sampled_from([b"v1", b"chat", b"..", b".", b"%2e", b"%2E%2e", b"%2f", b"metrics", b"", b"a\\b"]), max_size=6
    )
)
def test_whatever_a_server_resolves_a_served_path_to_stays_under_the_prefix(segments):
    path = b"/v1/" + b"/".join(segments)
    if ONLY_V1.allows(path):
        assert _resolve(path).startswith(b"/v1/")
