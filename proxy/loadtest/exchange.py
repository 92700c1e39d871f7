"""One load-test request, start to end, written into its row.

Theory of operation: `exchange(session, rec, i, shape, key, deadline, t0,
stream, check_json)` sends the request under `trio.move_on_at(deadline)` (the
client timeout, counted from the intended send time), reads the response to
the end and writes status, `x-rampmeter-reason`, end time and error kind into
row i. Streams are scanned, not parsed: the first chunk holding an SSE `data:`
event stamps the time to first token, and events other than `[DONE]` count as
output tokens. A 2xx non-streaming body must be JSON (msgspec validates without
building objects), else the row is `non_json`.

Failures are values in the row, never exceptions: connect errors, protocol
errors (resets, broken framing), timeouts. The response is released exactly
once in `finally`; `aclose()` never awaits, so a timeout cannot skip it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from proxy.core.wire import REASON
from proxy.errors import RampmeterError, UpstreamConnectError
from proxy.http.messages import header_value
from proxy.loadtest.records import (
    CONNECT_ERROR,
    NON_JSON,
    OK,
    PROTOCOL_ERROR,
    TIMEOUT,
    ReasonTable,
    Records,
)

_REASON = REASON.encode()
_DATA = b"data:"
_DONE = b"data: [DONE]"
_TAIL = 16  # bytes kept between chunks so an event split across them is counted once
_validate = msgspec.json.Decoder(msgspec.Raw).decode  # parses and validates, builds almost nothing
MAX_JSON_CHECK_BYTES = 8 << 20


async def _read_stream(resp: Any, rec: Records, i: int, t0: float, intended: float) -> int:
    """Consume an SSE body; stamps TTFT; returns the number of token events."""
    tail = b""
    events = done = 0
    while chunk := await resp.receive():
        buf = tail + chunk if tail else chunk
        new = buf.count(_DATA) - (tail.count(_DATA) if tail else 0)
        if new:
            if not events:
                rec.ttft[i] = trio.current_time() - t0 - intended
            events += new
            done += buf.count(_DONE) - (tail.count(_DONE) if tail else 0)
        tail = buf[-_TAIL:]
    return max(0, events - done)


async def _read_body(resp: Any, keep: bool) -> bytes:
    parts = []
    size = 0
    while chunk := await resp.receive():
        if keep and size < MAX_JSON_CHECK_BYTES:
            parts.append(chunk)
            size += len(chunk)
    return b"".join(parts)


async def exchange(
    session: Any,
    rec: Records,
    i: int,
    shape: int,
    key: bytes | None,
    deadline: float,
    t0: float,
    stream: bool,
    check_json: bool,
    reasons: ReasonTable,
) -> None:
    """Run row i's request (see the module doc). `t0` is the run's start (rows are run-relative)."""
    rec.sent[i] = trio.current_time() - t0
    error = OK
    with trio.move_on_at(deadline) as scope:
        try:
            resp = await session.send(shape, key)
        except UpstreamConnectError:
            error = CONNECT_ERROR
        except RampmeterError:
            error = PROTOCOL_ERROR
        else:
            try:
                status = resp.status
                rec.status[i] = status
                if status >= 300:
                    rec.reason[i] = reasons.index(header_value(resp.headers, _REASON))
                ok = 200 <= status < 300
                if stream and ok:
                    rec.tokens[i] = await _read_stream(resp, rec, i, t0, rec.intended[i])
                else:
                    body = await _read_body(resp, ok and check_json)
                    if ok and check_json and len(body) < MAX_JSON_CHECK_BYTES:
                        try:
                            _validate(body)
                        except msgspec.DecodeError:
                            error = NON_JSON
            except RampmeterError:
                error = PROTOCOL_ERROR
            finally:
                await resp.aclose()
    if scope.cancelled_caught:
        error = TIMEOUT
    rec.end[i] = trio.current_time() - t0
    rec.error[i] = error
