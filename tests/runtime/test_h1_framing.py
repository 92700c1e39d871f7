"""Every HTTP/1.1 framing rule of the server connection, one test each (proxy/http/h1parse.py lists them).

In-memory streams and trio's autojump clock, as tests/runtime/test_server_h1.py: raw
bytes in, raw bytes out, so what is asserted is exactly what a client sees.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from proxy.http.exchange import ServerContext
from proxy.http.h1server import H1ServerConnection
from proxy.policy.schema import Listen
from proxy.testing.handlers import Gate, echo, hello

LIMITS = Listen(max_body_bytes=4096, max_header_bytes=2048, header_timeout_s=5.0, idle_timeout_s=30.0)


class Peer:
    """The client end: raw bytes."""

    def __init__(self, stream: trio.testing.StapledStream) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_to_eof(self) -> bytes:
        out, self.buf = self.buf, b""
        while data := await self.stream.receive_some(65536):
            out += data
        return out

    async def response(self) -> tuple[bytes, bytes]:
        """One content-length framed response: (head, body)."""
        while b"\r\n\r\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            assert data, f"EOF before a response head: {self.buf!r}"
            self.buf += data
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = int(field(head, b"content-length") or b"0")
        while len(rest) < length:
            data = await self.stream.receive_some(65536)
            assert data, "EOF inside a response body"
            rest += data
        self.buf = rest[length:]
        return head, rest[:length]


def field(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return None


def status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


@asynccontextmanager
async def connection(handler, limits: Listen = LIMITS):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    ctx = ServerContext(handler, limits, None)
    conn = H1ServerConnection(ctx, server_stream, "192.0.2.7", trio.current_time())
    done = trio.Event()

    async def run() -> None:
        await conn.run(b"")
        done.set()

    with trio.fail_after(3600):  # virtual seconds: a hang fails at once
        async with trio.open_nursery() as nursery:
            await nursery.start(ctx.patrol.run)
            nursery.start_soon(run)
            yield Peer(client_stream), ctx, done
            nursery.cancel_scope.cancel()


async def refused(raw: bytes, handler=hello, limits: Listen = LIMITS) -> tuple[int, bytes, ServerContext]:
    """Send `raw`; expect one answer and a closed connection. Returns (status, whole answer, ctx)."""
    async with connection(handler, limits) as (peer, ctx, done):
        await peer.send(raw)
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.startswith(b"HTTP/1.1 "), answer
    head = answer.partition(b"\r\n\r\n")[0]
    assert field(head, b"connection") == b"close"
    return status(head), answer, ctx


# --- Content-Length and Transfer-Encoding (RFC 9112 6) ---


@pytest.mark.parametrize(
    "fields",
    [
        b"content-length: 5\r\ntransfer-encoding: chunked\r\n",
        b"transfer-encoding: chunked\r\ncontent-length: 5\r\n",
    ],
    ids=["cl-then-te", "te-then-cl"],
)
async def test_content_length_with_transfer_encoding_is_400_and_closes(fields, autojump_clock):
    raw = b"POST / HTTP/1.1\r\nhost: x\r\n" + fields + b"\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
    gate = Gate()
    async with connection(gate) as (peer, ctx, done):
        await peer.send(raw)
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert answer.count(b"HTTP/1.1 ") == 1  # the smuggled request is never answered
    assert gate.requests == [] and ctx.protocol_errors == 1


@pytest.mark.parametrize(
    "value",
    [b"5\r\ncontent-length: 5", b"5\r\ncontent-length: 6", b"5, 5", b"+5", b"-5", b"0x5", b"5 5", b"9" * 30, b""],
    ids=["duplicate-equal", "duplicate-differing", "list", "plus", "minus", "hex", "inner-space", "overflow", "empty"],
)
async def test_invalid_or_duplicate_content_length_is_400(value, autojump_clock):
    code, _, ctx = await refused(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: " + value + b"\r\n\r\nhello")
    assert code == 400 and ctx.protocol_errors == 1


@pytest.mark.parametrize("coding", [b"gzip", b"gzip, chunked", b"identity"])
async def test_transfer_coding_other_than_chunked_is_501(coding, autojump_clock):
    code, _, _ = await refused(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: " + coding + b"\r\n\r\n")
    assert code == 501


async def test_transfer_encoding_in_http10_request_is_400(autojump_clock):
    code, _, _ = await refused(b"POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
    assert code == 400


async def test_chunk_size_overflow_fails_the_body_with_400(autojump_clock):
    raw = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + b"F" * 20 + b"\r\n"
    code, answer, _ = await refused(raw, echo)
    assert code == 400 and b"chunk" in answer.lower()


async def test_chunk_without_crlf_after_its_data_is_400(autojump_clock):
    raw = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxy0\r\n\r\n"
    code, _, _ = await refused(raw, echo)
    assert code == 400


async def test_chunked_body_with_extensions_and_trailers_arrives_whole(autojump_clock):
    async with connection(echo) as (peer, _, _):
        await peer.send(
            b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: dropped\r\n\r\n"
        )
        head, body = await peer.response()
        assert status(head) == 200 and body == b"abcde"
        assert field(head, b"x-trailer") is None


# --- line endings, folding, field syntax (RFC 9112 2.2, 5) ---


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\nhost: x\n\n",
        b"GET / HTTP/1.1\r\nhost: x\nx-a: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: x\rx-a: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: x\r\nx-a: b\r\n c\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost : x\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: x\x00y\r\n\r\n",
    ],
    ids=["bare-lf", "bare-lf-in-fields", "bare-cr", "obs-fold", "space-before-colon", "nul-in-value"],
)
async def test_ambiguous_line_ends_and_field_syntax_are_400(raw, autojump_clock):
    code, _, ctx = await refused(raw)
    assert code == 400 and ctx.protocol_errors == 1


async def test_head_that_trickles_in_past_the_cap_is_431_without_being_held_whole(autojump_clock):
    async with connection(hello) as (peer, ctx, done):
        await peer.send(b"GET / HTTP/1.1\r\nhost: x\r\nx-long: ")
        answer = b""
        for _ in range(LIMITS.max_header_bytes // 256 + 8):  # a header line that never ends
            try:
                await peer.send(b"a" * 256)
            except trio.BrokenResourceError:
                break
            await trio.testing.wait_all_tasks_blocked()
            if done.is_set():
                break
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert ctx.protocol_errors == 1


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nhost: x\r\n\r\n", 505),
        (b"GET / HTTP/1.1 junk\r\nhost: x\r\n\r\n", 400),
        (b"FOO@ / HTTP/1.1\r\nhost: x\r\n\r\n", 400),
    ],
    ids=["no-host", "two-hosts", "http2-line", "junk-after-version", "bad-method"],
)
async def test_bad_request_lines_and_host_fields(raw, code, autojump_clock):
    assert (await refused(raw))[0] == code


# --- request targets (RFC 9112 3.2) ---


async def test_absolute_form_target_is_normalised_and_its_authority_wins(autojump_clock):
    async with connection(echo) as (peer, _, _):
        await peer.send(b"GET http://model.internal:8000/v1/models?x=1 HTTP/1.1\r\nhost: other\r\n\r\n")
        head, _ = await peer.response()
    assert status(head) == 200
    assert field(head, b"x-echo-target") == b"/v1/models?x=1"
    assert field(head, b"x-echo-authority") == b"model.internal:8000"


async def test_options_asterisk_is_answered_by_the_server(autojump_clock):
    gate = Gate()
    async with connection(gate) as (peer, _, _):
        await peer.send(b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
        head, body = await peer.response()
        assert status(head) in (200, 204) and field(head, b"allow") and body == b""
        await peer.send(b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")  # and the connection stays usable
        assert status((await peer.response())[0]) in (200, 204)
    assert gate.requests == []


@pytest.mark.parametrize(
    "line",
    [b"GET * HTTP/1.1", b"CONNECT example.com:443 HTTP/1.1", b"GET ftp://x/ HTTP/1.1", b"GET http://u@x/ HTTP/1.1"],
)
async def test_other_targets_are_400(line, autojump_clock):
    assert (await refused(line + b"\r\nhost: x\r\n\r\n"))[0] == 400


async def test_upgrade_request_is_served_as_plain_http11(autojump_clock):
    async with connection(hello) as (peer, _, _):
        await peer.send(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
        assert status((await peer.response())[0]) == 200
        await peer.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert status((await peer.response())[0]) == 200


# --- keep-alive, pipelining, HTTP/1.0 (RFC 9112 9.3) ---


async def test_http10_keep_alive_is_honoured_with_a_length_framed_answer(autojump_clock):
    async with connection(hello) as (peer, _, done):
        for _ in range(2):
            await peer.send(b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            head, body = await peer.response()
            assert status(head) == 200 and body == b"hello\n"
            assert field(head, b"connection") == b"keep-alive"
        assert not done.is_set()


async def test_http10_without_keep_alive_closes_after_the_answer(autojump_clock):
    async with connection(hello) as (peer, _, done):
        await peer.send(b"GET / HTTP/1.0\r\n\r\n")
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"hello\n")


async def test_connection_close_is_answered_with_close_and_later_pipelined_requests_are_not(autojump_clock):
    async with connection(hello) as (peer, ctx, done):
        await peer.send(
            b"GET /1 HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /2 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            b"GET /3 HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.count(b"HTTP/1.1 200 ") == 2
    assert ctx.requests_total == 2
    second = answer.split(b"HTTP/1.1 200 ")[2]
    assert field(b"x\r\n" + second.partition(b"\r\n\r\n")[0], b"connection") == b"close"


async def test_pipelined_requests_with_bodies_are_answered_in_order(autojump_clock):
    async with connection(echo) as (peer, _, _):
        await peer.send(
            b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nA"
            b"POST /b HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n1\r\nB\r\n0\r\n\r\n"
            b"GET /c HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        bodies = [(await peer.response())[1] for _ in range(3)]
    assert bodies == [b"A", b"B", b""]


async def test_expect_100_continue_is_not_sent_once_body_bytes_arrived(autojump_clock):
    async with connection(echo) as (peer, _, _):
        await peer.send(b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\nbody")
        head, body = await peer.response()
    assert status(head) == 200 and body == b"body"


async def test_expect_100_continue_is_never_sent_to_http10(autojump_clock):
    async with connection(echo) as (peer, _, _):
        await peer.send(
            b"POST / HTTP/1.0\r\nconnection: keep-alive\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n"
        )
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(b"body")
        head, body = await peer.response()
    assert status(head) == 200 and body == b"body"


# --- bodies the response must not have (RFC 9110 9.3.2, 15.3.5, 15.4.5) ---


async def test_head_gets_the_length_but_no_body_and_the_connection_stays_in_sync(autojump_clock):
    async def streamed(request, sink):
        await sink.start(200, [(b"content-type", b"text/plain")])
        await sink.send(b"never on the wire")
        await sink.end()

    async with connection(streamed) as (peer, _, _):
        await peer.send(b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n")
        while b"never on the wire" not in peer.buf:
            peer.buf += await peer.stream.receive_some(65536)
    first, _, second = peer.buf.partition(b"\r\n\r\n")
    assert status(first) == 200
    assert second.startswith(b"HTTP/1.1 200 "), "the HEAD answer carried body bytes"


async def test_204_and_304_have_neither_body_nor_length(autojump_clock):
    async def no_content(request, sink):
        await sink.respond(int(request.target[1:]), [], b"")

    async with connection(no_content) as (peer, _, _):
        for code in (204, 304):
            await peer.send(b"GET /%d HTTP/1.1\r\nhost: x\r\n\r\n" % code)
            head, body = await peer.response()
            assert status(head) == code and body == b""
            assert field(head, b"content-length") is None and field(head, b"transfer-encoding") is None


async def test_a_handler_sending_more_than_its_content_length_breaks_the_connection(autojump_clock):
    async def liar(request, sink):
        await sink.start(200, [(b"content-length", b"2")])
        await sink.send(b"abc")
        await sink.end()

    async with connection(liar) as (peer, _, done):
        await peer.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = await peer.read_to_eof()
        await done.wait()
    assert not answer.endswith(b"abc")  # never more than it said


async def test_streamed_answer_with_its_content_length_keeps_the_connection(autojump_clock):
    async def sized(request, sink):
        await sink.start(200, [(b"content-length", b"5")])
        await sink.send(b"he")
        await sink.send(b"llo")
        await sink.end()

    async with connection(sized) as (peer, _, done):
        for _ in range(2):
            await peer.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head, body = await peer.response()
            assert body == b"hello" and field(head, b"transfer-encoding") is None
        assert not done.is_set()


# --- a body that stalls (issue 13 defect 2): the request's deadline and body_timeout_s ---


async def test_a_stalled_body_gets_408_after_body_timeout_s(autojump_clock):
    limits = Listen(max_body_bytes=4096, body_timeout_s=7.0)
    async with connection(echo, limits) as (peer, ctx, done):
        await peer.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        start = trio.current_time()
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer
    assert trio.current_time() - start == pytest.approx(7.0)


async def test_the_requests_own_deadline_applies_while_its_body_is_read(autojump_clock):
    limits = Listen(max_body_bytes=4096, body_timeout_s=60.0)
    async with connection(echo, limits) as (peer, _, done):
        start = trio.current_time()
        await peer.send(b"POST / HTTP/1.1\r\nhost: x\r\nx-request-timeout-ms: 1500\r\ncontent-length: 10\r\n\r\nab")
        await trio.sleep(1.0)
        await peer.send(b"cd")  # progress, but the deadline still stands
        answer = await peer.read_to_eof()
        await done.wait()
    assert answer.startswith(b"HTTP/1.1 408 ") and b"deadline" in answer
    assert trio.current_time() - start == pytest.approx(1.5)


async def test_a_body_that_keeps_coming_is_not_cut_by_body_timeout_s(autojump_clock):
    limits = Listen(max_body_bytes=4096, body_timeout_s=2.0)
    async with connection(echo, limits) as (peer, _, _):
        await peer.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
        for byte in b"hello":
            await trio.sleep(1.5)  # each wait shorter than the timeout
            await peer.send(bytes([byte]))
        head, body = await peer.response()
    assert status(head) == 200 and body == b"hello"


async def test_a_client_hanging_up_mid_request_cancels_the_handler(autojump_clock):
    gate = Gate()
    async with connection(gate) as (peer, ctx, done):
        await peer.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await gate.arrived.wait()
        await peer.stream.send_stream.aclose()
        await gate.gone.wait()
        await done.wait()
    assert gate.requests[0].client_gone and ctx.client_disconnects == 1
    assert ctx.patrol.watchers == 1
