"""An HTTP/2 client on the request path's fast path (no cancel scope, issue 16): the relay checks the
deadline on the clock before the one write, and holds a scope only around a streamed answer."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio
import trio.testing

from proxy.core import wire
from proxy.core.decisions import Outcome
from proxy.http.messages import Request
from proxy.runtime import relay


class SlowResponse:
    """An upstream answer whose body arrives after `delay_s` (per chunk)."""

    all_received = False  # the relay's whole-answer shortcut: never taken for these (they arrive late)

    def __init__(self, chunks: list[bytes], delay_s: float, length: bool = True) -> None:
        total = sum(len(c) for c in chunks)
        self.status, self.http_version = 200, "1.1"
        self.headers = [(b"content-length", b"%d" % total)] if length else []
        self._chunks, self._delay = list(chunks), delay_s

    async def receive(self) -> bytes:
        await trio.sleep(self._delay)
        return self._chunks.pop(0) if self._chunks else b""


class BoundingPool:
    """A pool that bounds deadlines itself (as the HTTP/1.1 upstream pool does), here by not at all."""

    def __init__(self, response: SlowResponse) -> None:
        self.response = response

    def authority(self, upstream: int) -> bytes:
        return b"pod:8000"

    def bounds_deadlines(self, upstream: int) -> bool:
        return True

    @asynccontextmanager
    async def request(self, upstream, method, target, headers, body, deadline=None):
        yield self.response


class Sink:
    def __init__(self) -> None:
        self.headers_sent = False
        self.answers: list[tuple[int, list, bytes]] = []
        self.sent: list[bytes] = []

    async def respond(self, status, headers, body=b"") -> None:
        self.headers_sent = True
        self.answers.append((status, headers, body))

    async def start(self, status, headers) -> None:
        self.headers_sent = True
        self.answers.append((status, headers, b""))

    async def send(self, data) -> None:
        self.sent.append(data)
        await trio.lowlevel.checkpoint()

    async def end(self) -> None:
        pass


def h2_request() -> Request:
    return Request(b"POST", b"/v1/x", [], body=None, http_version="2", client="192.0.2.1")


async def _forward(response: SlowResponse, sink: Sink, budget_s: float, request: Request | None = None):
    released = []
    result = await relay.forward(
        BoundingPool(response),
        0,
        60.0,
        request or h2_request(),
        b"",
        sink,
        [],
        trio.current_time() + budget_s,
        released.append,
        scoped=False,
    )
    return result, released


async def test_a_whole_answer_past_the_deadline_is_a_504_not_a_write(autojump_clock) -> None:
    sink = Sink()
    result, released = await _forward(SlowResponse([b'{"ok":true}'], delay_s=0.3), sink, budget_s=0.5)
    assert result.reason is wire.Reason.DEADLINE_EXPIRED
    assert [a[0] for a in sink.answers] == [504]  # the upstream's 200 never went out
    assert released[0].outcome is Outcome.SUCCESS  # the upstream's part was over: its slot went back


async def test_a_whole_answer_in_time_goes_out_with_no_scope(autojump_clock) -> None:
    sink = Sink()
    result, _ = await _forward(SlowResponse([b'{"ok":true}'], delay_s=0.1), sink, budget_s=0.5)
    assert result.outcome is Outcome.SUCCESS and [a[0] for a in sink.answers] == [200]


async def test_a_streamed_answer_is_cut_at_the_deadline(autojump_clock) -> None:
    sink = Sink()
    response = SlowResponse([b"data: 1\n\n"] * 10, delay_s=0.1, length=False)
    start = trio.current_time()
    try:
        await _forward(response, sink, budget_s=0.35)
    except trio.TooSlowError:
        pass  # the request path turns it into ResponseAborted: the head went out, the stream is cut
    else:
        raise AssertionError("the stream outlived its deadline")
    assert trio.current_time() - start == 0.35
    assert [a[0] for a in sink.answers] == [200] and 1 <= len(sink.sent) < 10


async def test_an_http11_client_gets_no_clock_check_its_server_bounds_the_writes(autojump_clock) -> None:
    sink = Sink()
    h1 = Request(b"POST", b"/v1/x", [], body=None, http_version="1.1", client="192.0.2.1")
    result, _ = await _forward(SlowResponse([b'{"ok":true}'], delay_s=0.3), sink, budget_s=0.5, request=h1)
    assert result.outcome is Outcome.SUCCESS and [a[0] for a in sink.answers] == [200]


class UnaryGrpcAnswer(SlowResponse):
    """A unary gRPC answer: its message and trailers all in by the first read, after `delay_s`."""

    def __init__(self, message: bytes, delay_s: float) -> None:
        super().__init__([message], delay_s, length=False)
        self.trailers = [(b"grpc-status", b"0")]
        self.all_received = False

    async def receive(self) -> bytes:
        if self.all_received:
            return b""
        await trio.sleep(self._delay)
        self.all_received = True  # the trailers and END_STREAM came with the DATA
        return self._chunks.pop(0)


class TrailerSink(Sink):
    async def trailers(self, fields) -> None:
        self.answers.append((0, fields, b""))


async def test_a_unary_grpc_answer_complete_at_its_first_read_goes_out_head_message_trailers(autojump_clock) -> None:
    sink = TrailerSink()
    result, _ = await _forward(UnaryGrpcAnswer(b"\x00\x00\x00\x00\x02hi", delay_s=0.1), sink, budget_s=0.5)
    assert result.outcome is Outcome.SUCCESS
    assert [a[0] for a in sink.answers] == [200, 0] and sink.sent == [b"\x00\x00\x00\x00\x02hi"]
    assert sink.answers[1][1] == [(b"grpc-status", b"0")]


async def test_a_unary_grpc_answer_past_the_deadline_is_a_504_before_any_write(autojump_clock) -> None:
    # The whole-answer path (no stream scope): the clock is checked before the head goes out, so the
    # client gets the sidecar's 504 rather than a started stream cut by a scope.
    sink = TrailerSink()
    result, released = await _forward(UnaryGrpcAnswer(b"\x00\x00\x00\x00\x02hi", delay_s=0.3), sink, budget_s=0.2)
    assert result.reason is wire.Reason.DEADLINE_EXPIRED
    assert [a[0] for a in sink.answers] == [504] and sink.sent == []
