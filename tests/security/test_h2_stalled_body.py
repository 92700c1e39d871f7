"""Defect 2, h2 side: a request body that stalls is timed out with RST_STREAM.

The attacker opens streams announcing `content-length: 100000`, sends a few body bytes
and then nothing. Before the fix such streams stayed open for ever, even with
`x-request-timeout-ms: 2000`. Wanted: the request's own deadline applies while its body
is read, and so does listen.body_timeout_s (the longest the sidecar waits for the next
body bytes); either way the stream is reset with RST_STREAM(CANCEL), and ordinary clients
are served meanwhile.
"""

from __future__ import annotations

import threading
import time

import pytest
from hyperframe.frame import DataFrame

from tests.security.h2attack import CANCEL, RST_STREAM, RawH2
from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

LIMIT_S = 1.5
STREAMS = 50
CASES = {
    # (extra request headers, policy)
    "request_deadline": ([(b"x-request-timeout-ms", b"%d" % (LIMIT_S * 1000))], ""),
    "body_timeout": ([], f"[listen]\nbody_timeout_s = {LIMIT_S}\n"),
}


def _stalled_bodies(stack, extra, resets: list[tuple[int, float]], sent_at: list[float]) -> None:
    with RawH2(stack) as conn:
        blob, sids = b"", []
        for _ in range(STREAMS):
            sid, head = conn.head(
                extra=[(b"content-type", b"application/json"), (b"content-length", b"100000"), *extra]
            )
            sids.append(sid)
            blob += head + DataFrame(sid, data=b'{"model": "m"').serialize()
        conn.send(blob)
        sent_at.append(time.monotonic())
        frames = conn.reader.until(lambda fs: sum(f.kind == RST_STREAM for f in fs) >= STREAMS, LIMIT_S + 8)
        resets += [(f.error_code, time.monotonic()) for f in frames if f.kind == RST_STREAM and f.sid in sids]


@pytest.mark.parametrize("case", list(CASES))
def test_stalled_request_body_is_reset_at_its_deadline(case, tmp_path):
    extra, policy_text = CASES[case]
    policy = None
    if policy_text:
        policy = tmp_path / "policy.toml"
        policy.write_text(policy_text)
    with attacked_stack(policy=str(policy) if policy else None) as stack:
        with Bystander(stack, rate=20) as h1, Bystander(stack, rate=20, http2=True) as h2c:
            resets: list[tuple[int, float]] = []
            sent_at: list[float] = []
            attackers = [
                threading.Thread(target=_stalled_bodies, args=(stack, extra, resets, sent_at)) for _ in range(2)
            ]
            for t in attackers:
                t.start()
            for t in attackers:
                t.join(LIMIT_S + 12)
        h1.report().check(min_success=0.95, max_p99_s=1.0)
        h2c.report().check(min_success=0.95, max_p99_s=1.0)
        assert len(resets) == 2 * STREAMS, f"{len(resets)} of {2 * STREAMS} stalled streams were reset"
        assert {code for code, _ in resets} == {CANCEL}
        took = max(at for _, at in resets) - min(sent_at)
        assert LIMIT_S - 0.2 <= took <= LIMIT_S + 2.5, took
        assert_clean_log(stack.sidecar)
