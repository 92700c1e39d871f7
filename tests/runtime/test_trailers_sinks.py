"""Trailers through the sinks and the relay (issue 17): HTTP/1.1 chunked trailers only for a client that
said `te: trailers`, the dedup recording that keeps them for followers and replays, and request
trailers from an HTTP/2 client up to an h2c upstream."""

from __future__ import annotations

import h11
import msgspec

from proxy.core import dedup as events
from proxy.http.messages import Request
from proxy.runtime.relay import forward
from proxy.runtime.sinks import RecordingSink, play
from tests.runtime.test_server_h1 import connection
from tests.runtime.test_server_h2 import connection as h2_connection
from tests.runtime.test_upstream_h2 import h2_upstream, ok

TRAILERS = [(b"grpc-status", b"0"), (b"x-done", b"yes"), (b"content-length", b"9")]


async def streams_with_trailers(request, sink) -> None:
    await sink.start(200, [(b"content-type", b"application/grpc")])
    await sink.send(b"payload")
    await sink.trailers(TRAILERS)


async def exchange(te: bool):
    async with connection(streams_with_trailers) as (client, _, _):
        await client.request(b"/m", b"POST", headers=[(b"te", b"trailers")] if te else [], body=b"x")
        got = []
        while True:
            event = client.h11.next_event()
            if event is h11.NEED_DATA:
                client.h11.receive_data(await client.stream.receive_some(65536))
            elif isinstance(event, h11.Data):
                got.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(got), list(event.headers)


async def test_http1_trailers_go_to_a_client_that_asked_without_framing_fields(autojump_clock):
    body, trailers = await exchange(te=True)
    assert body == b"payload"
    assert trailers == [(b"grpc-status", b"0"), (b"x-done", b"yes")]  # content-length is never a trailer


async def test_http1_trailers_are_dropped_for_a_client_that_did_not_ask(autojump_clock):
    body, trailers = await exchange(te=False)
    assert (body, trailers) == (b"payload", [])


class Handle:
    def __init__(self) -> None:
        self.log: list = []

    def record_head(self, status, headers, streamed=False):
        self.log.append(events.Head(status, headers, streamed))

    def record_chunk(self, data):
        self.log.append(events.Chunk(data))

    def record_trailers(self, headers):
        self.log.append(events.Trailers(headers))


class Source:
    def __init__(self, log) -> None:
        self._log = [*log, events.END]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for event in self._log:
            yield event


class Client:
    def __init__(self) -> None:
        self.calls: list = []
        self.headers_sent = False

    async def respond(self, status, headers, body=b""):
        self.calls.append(("respond", status, body))

    async def start(self, status, headers):
        self.headers_sent = True
        self.calls.append(("start", status))

    async def send(self, data):
        self.calls.append(("send", data))

    async def end(self):
        self.calls.append(("end",))

    async def trailers(self, headers):
        self.calls.append(("trailers", headers))


async def test_a_recorded_response_plays_back_with_its_trailers():
    handle = Handle()
    recording = RecordingSink(handle)
    await streams_with_trailers(None, recording)
    client = Client()
    await play(Source(handle.log), client)
    assert client.calls == [("start", 200), ("send", b"payload"), ("trailers", TRAILERS)]


def test_a_stored_response_replays_its_trailers_and_old_records_still_decode():
    stored = events.Stored("fp", 200, [], [b"a"], True, [(b"grpc-status", b"0")])
    assert events.replay_events(stored)[-2] == events.Trailers([(b"grpc-status", b"0")])
    old = msgspec.msgpack.encode(["fp", 200, [], [b"a"], True])  # a record written before trailers were kept
    assert msgspec.msgpack.decode(old, type=events.Stored).trailers == []
    assert events.replay_events(msgspec.msgpack.decode(old, type=events.Stored))[-1] is events.END


async def reports_request_trailers(request, sink) -> None:
    body = await request.body.read_all()
    await sink.respond(200, [(b"x-trailers", repr(request.trailers).encode())], body)


async def test_the_h2_server_keeps_a_requests_trailers(autojump_clock):
    async with h2_connection(reports_request_trailers) as (peer, _, _, _):
        sid = await peer.request(b"/m", method=b"POST", end=False)
        await peer.send(sid, b"body")
        peer.conn.send_headers(sid, [(b"x-checksum", b"abc")], end_stream=True)
        await peer.flush()
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].body == b"body"
        assert peer.streams[sid].header(b"x-trailers") == b"[(b'x-checksum', b'abc')]"


class _Collect:
    headers_sent = False

    async def respond(self, status, headers, body=b""):
        self.answer = (status, body)


async def test_request_trailers_go_up_after_the_body_to_an_h2c_upstream():
    request = Request(b"POST", b"/m", [(b"host", b"x")], None, http_version="2")  # type: ignore[arg-type]
    request.trailers = [(b"x-checksum", b"abc"), (b"connection", b"close")]
    async with h2_upstream(ok) as (server, pool):
        sink = _Collect()
        result = await forward(pool, 0, 10.0, request, b"payload", sink, [])
        assert result.status == 200 and sink.answer == (200, b"ok")
        assert server.exchanges[0].body == b"payload"
        assert server.exchanges[0].trailers == [(b"x-checksum", b"abc")]  # hop-by-hop fields never
