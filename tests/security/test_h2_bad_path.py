"""Defect 7, h2 side: request targets that are not a path answer 400 (or, for `OPTIONS *`, 200).

Before the fix a `:path` that does not start with "/" reached cost estimation, which
found no route and answered 500 with a traceback: anyone could fill the log. Wanted:
empty, relative or absolute-form `:path` (RFC 9113 8.3.1 allows only origin-form and `*`)
answers 400 on its own stream with no traceback, `OPTIONS *` is answered by the sidecar
itself, and the connection keeps serving its other streams.
"""

from __future__ import annotations

import time

import h2.events
import pytest

from tests.security.h2attack import RawH2
from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

CASES = [
    # (method, :path, expected status)
    (b"GET", b"", 400),
    (b"POST", b"v1/chat/completions", 400),
    (b"POST", b"http://attack/v1/chat/completions", 400),
    (b"GET", b"*", 400),  # `*` is for OPTIONS only
    (b"OPTIONS", b"*", 200),
]
ROUNDS = 200  # each case this many times: enough to fill a log that logs them


def _statuses(conn: RawH2, sids: set[int]) -> dict[int, int]:
    statuses: dict[int, int] = {}

    def done(events) -> bool:
        for e in events:
            if isinstance(e, h2.events.ResponseReceived) and e.stream_id in sids:
                statuses.setdefault(e.stream_id, int(dict(e.headers)[b":status"]))
        return len(statuses) == len(sids)

    conn.events_until(done, 10.0)
    return statuses


def test_bad_request_targets_answer_400_and_options_star_is_answered():
    with attacked_stack() as stack:
        with Bystander(stack, rate=20, http2=True) as bystander:
            with RawH2(stack) as conn:
                expected, blob = {}, b""
                for _ in range(ROUNDS):
                    for method, path, status in CASES:
                        sid, head = conn.head(path=path, method=method, end_stream=True)
                        expected[sid], blob = status, blob + head
                    conn.send(blob)
                    statuses = _statuses(conn, set(expected))
                    assert statuses == expected, {sid: (statuses.get(sid), want) for sid, want in expected.items()}
                    expected, blob = {}, b""
                # The connection still serves an ordinary request.
                sid, data = conn.chat()
                conn.send(data)
                assert _statuses(conn, {sid}) == {sid: 200}
            time.sleep(0.3)
        bystander.report().check(min_success=0.95, max_p99_s=1.0)
        assert_clean_log(stack.sidecar)
        assert len(stack.sidecar.log_path.read_text().splitlines()) < 50, "the bad targets filled the log"
