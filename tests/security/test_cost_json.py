"""Issue 13 defect 8: JSON nested ~1,000 deep (2.2 KB) answered 500 from a RecursionError in cost estimation.

The attack: bodies nested past the decoder's recursion bound, on every path the
cost estimate reads (a named chat and completions route, where the deep value is
an unknown field or the prompt, and an unmatched path costed by its shape), sent
over real TCP as fast as one connection allows for a bounded time. Wanted: each
answered 400 naming the body, quickly, with no traceback in the log, while a
bystander on another connection keeps being served and /readyz stays 200.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

DEPTH = 1000  # the 2.2 KB body
ATTACKS = [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tools": %s}'),
    ("/v1/completions", b'{"prompt": %s, "max_tokens": 1}'),
    ("/embeddings", b'{"input": %s}'),  # no route names it: costed by shape, so parsed too
]


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2c"])
def test_deeply_nested_json_is_answered_400_and_bystanders_are_served(http2):
    with attacked_stack() as stack:
        answers: dict[int, int] = {}
        sent = 0
        attacker = httpx.Client(http2=http2, http1=not http2, timeout=5.0)
        with Bystander(stack, rate=20) as bystander, attacker:
            end = time.monotonic() + 2.0
            while time.monotonic() < end and sent < 600:
                path, template = ATTACKS[sent % len(ATTACKS)]
                body = template % nested(DEPTH + 500 * (sent % 3))
                resp = attacker.post(stack.url + path, content=body, headers={"content-type": "application/json"})
                answers[resp.status_code] = answers.get(resp.status_code, 0) + 1
                if resp.status_code == 400:
                    error = resp.json()["error"]
                    assert error["code"] == "bad_request" and "nested too deeply" in error["message"], error
                sent += 1
        assert sent >= 30, f"only {sent} attack requests in 2 s"
        assert answers == {400: sent}, answers
        bystander.report().check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        assert_clean_log(stack.sidecar)


def test_moderate_nesting_is_still_served():
    """The bound is the decoder's recursion limit, not a low cap: 100 levels of tool schema pass."""
    with attacked_stack() as stack:
        body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": %s}' % nested(100)
        resp = httpx.post(
            stack.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 200, resp.text
