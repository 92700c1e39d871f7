"""Reusable in-process handlers for tests, benchmarks and demos of `proxy.http.server`.

Theory of operation: each handler follows the `Handler` interface and does one
observable thing: answer a constant (`hello`), echo the request (`echo`,
`stream_echo`), send a large body (`blob`), or park on events that the test
controls (`Gate`), recording what happened to each request (cancelled, client
gone) so a test can assert on it without timing anything. `Router` picks one
by path so one server can serve a whole test module. `H2Peer` is the other end:
a frame-level HTTP/2 client for tests of resets, windows and GOAWAY.
"""

from __future__ import annotations

import trio

from proxy.http.messages import Handler, Headers, Request, ResponseSink

TEXT = [(b"content-type", b"text/plain")]
BINARY = [(b"content-type", b"application/octet-stream")]


async def hello(request: Request, sink: ResponseSink) -> None:
    """200 'hello' (the benchmark handler: one respond(), no body read)."""
    await sink.respond(200, TEXT, b"hello\n")


def describe(request: Request) -> Headers:
    """What the server parsed, as response headers (x-echo-*)."""
    return [
        (b"x-echo-method", request.method),
        (b"x-echo-target", request.target),
        (b"x-echo-authority", request.authority),
        (b"x-echo-scheme", request.scheme),
        (b"x-echo-version", request.http_version.encode()),
        (b"x-echo-client", request.client.encode()),
        (b"x-echo-content-length", str(request.body.content_length).encode()),
    ]


async def echo(request: Request, sink: ResponseSink) -> None:
    """Read the whole body, answer it back with one respond()."""
    body = await request.body.read_all()
    await sink.respond(200, BINARY + describe(request), body)


async def stream_echo(request: Request, sink: ResponseSink) -> None:
    """Answer each body chunk as it arrives (a streamed, chunked-on-h1 response)."""
    await sink.start(200, BINARY + describe(request))
    async for chunk in request.body.chunks():
        await sink.send(chunk)
    await sink.end()


def pattern(size: int) -> bytes:
    """`size` deterministic bytes that are not all alike, so misordered data shows."""
    unit = bytes(range(251))  # prime length: chunk boundaries never line up with it
    return (unit * (size // len(unit) + 1))[:size]


def blob(size: int, *, streamed: bool = False, chunk_size: int = 65_536) -> Handler:
    """A handler answering `pattern(size)`, in one respond() or streamed in chunks."""
    data = pattern(size)

    async def handler(request: Request, sink: ResponseSink) -> None:
        if not streamed:
            await sink.respond(200, BINARY, data)
            return
        await sink.start(200, BINARY)
        for offset in range(0, size, chunk_size):
            await sink.send(data[offset : offset + chunk_size])
        await sink.end()

    return handler


class Gate:
    """A streaming handler that sends `chunks[i]`, then waits for `opens[i]`, for each i.

    `arrived` is set when a request reaches the handler; `gone` when a handler is
    cancelled; `requests` and `cancelled` list the requests. With no chunks it
    waits for `release` and then answers 200 'released' (a slow plain request).
    """

    def __init__(self, chunks: list[bytes] | None = None) -> None:
        self.chunks = chunks or []
        self.opens = [trio.Event() for _ in self.chunks]
        self.release = trio.Event()
        self.arrived = trio.Event()
        self.gone = trio.Event()
        self.requests: list[Request] = []
        self.cancelled: list[Request] = []
        self.finished: list[Request] = []

    def __repr__(self) -> str:
        counts = f"{len(self.requests)}/{len(self.cancelled)}/{len(self.finished)}"
        return f"<Gate arrived/cancelled/finished={counts}>"

    async def __call__(self, request: Request, sink: ResponseSink) -> None:
        self.requests.append(request)
        self.arrived.set()
        try:
            if not self.chunks:
                await self.release.wait()
                await sink.respond(200, TEXT, b"released\n")
            else:
                await sink.start(200, TEXT)
                for chunk, opened in zip(self.chunks, self.opens, strict=False):
                    await sink.send(chunk)
                    await opened.wait()
                await sink.end()
        except trio.Cancelled:
            self.cancelled.append(request)
            self.gone.set()
            raise
        self.finished.append(request)


class Router:
    """Dispatch on the request path; unknown paths get 404."""

    def __init__(self, routes: dict[bytes, Handler]) -> None:
        self.routes = routes

    async def __call__(self, request: Request, sink: ResponseSink) -> None:
        handler = self.routes.get(request.path)
        if handler is None:
            await sink.respond(404, TEXT, b"no such path\n")
            return
        await handler(request, sink)


class PeerStream:
    """What an `H2Peer` saw on one stream."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: Headers = []
        self.chunks: list[bytes] = []
        self.trailers: Headers | None = None
        self.ended = False
        self.reset_code: int | None = None

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class H2Peer:
    """A raw HTTP/2 client (h2 state machine) over any trio stream, for tests that need
    frame-level control: resets, windows, GOAWAY, refused streams, garbage.

    `receive()` reads once and records events per stream; `until(predicate)` reads
    until the predicate holds or the server closes. Received DATA is acknowledged at
    once unless `auto_ack=False` (then the test opens windows with `ack()`).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        auto_ack: bool = True,
        settings: dict | None = None,
        obey_stream_limit: bool = True,
    ) -> None:
        import h2.config
        import h2.connection

        self.stream = stream
        self.auto_ack = auto_ack
        self.obey_stream_limit = obey_stream_limit  # False: open streams past the server's limit
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        # h2 closes its state machine on GOAWAY, but streams up to last-stream-id may still
        # finish (RFC 9113 6.8) and frames keep coming for them: keep it open so tests can
        # watch them finish (an instance table shadows the class's).
        machine = self.conn.state_machine
        open_ = h2.connection.ConnectionState.CLIENT_OPEN
        machine._transitions = {
            **machine._transitions,
            (open_, h2.connection.ConnectionInputs.RECV_GOAWAY): (None, open_),
        }
        self.settings = settings or {}
        self.streams: dict[int, PeerStream] = {}
        self.goaway: tuple[int, int] | None = None  # (error_code, last_stream_id) of the last GOAWAY
        self.goaways: list[tuple[int, int]] = []  # every GOAWAY, in order
        self.remote_max_streams: int | None = None
        self.closed = False

    async def start(self) -> None:
        self.conn.initiate_connection()
        if self.settings:
            self.conn.update_settings(self.settings)
        await self.flush()

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send_all(data)

    async def request(
        self,
        path: bytes = b"/",
        *,
        method: bytes = b"GET",
        headers: Headers | tuple[()] = (),
        body: bytes | None = None,
        end: bool = True,
    ) -> int:
        sid = self.conn.get_next_available_stream_id()
        pseudo = [
            (b":method", method),
            (b":path", path),
            (b":scheme", b"http"),
            (b":authority", b"test"),
        ]
        self.conn.send_headers(sid, pseudo + list(headers), end_stream=end and not body)
        self.streams[sid] = PeerStream()
        if body:
            await self.send(sid, body, end=end)
        await self.flush()
        return sid

    async def send(self, sid: int, data: bytes, *, end: bool = False) -> None:
        """DATA frames of at most the server's frame size (the caller minds the windows)."""
        step = self.conn.max_outbound_frame_size
        for offset in range(0, max(len(data), 1), step):
            last = offset + step >= len(data)
            self.conn.send_data(sid, data[offset : offset + step], end_stream=end and last)
        await self.flush()

    async def reset(self, sid: int, code: int = 8) -> None:  # 8 = CANCEL
        self.conn.reset_stream(sid, code)
        await self.flush()

    async def ack(self, sid: int, size: int) -> None:
        self.conn.acknowledge_received_data(size, sid)
        await self.flush()

    async def receive(self) -> None:
        import h2.connection
        import h2.events
        from h2.settings import SettingCodes

        data = await self.stream.receive_some(65_536)
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
            if isinstance(event, h2.events.ResponseReceived) and stream:
                stream.headers = [(k, v) for k, v in event.headers if not k.startswith(b":")]
                stream.status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived) and stream:
                stream.chunks.append(event.data)
                if self.auto_ack and event.flow_controlled_length:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived) and stream:
                stream.trailers = list(event.headers)
            elif isinstance(event, h2.events.StreamEnded) and stream:
                stream.ended = True
            elif isinstance(event, h2.events.StreamReset) and stream:
                stream.reset_code = int(event.error_code)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = (int(event.error_code or 0), int(event.last_stream_id or 0))
                self.goaways.append(self.goaway)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                changed = event.changed_settings.get(SettingCodes.MAX_CONCURRENT_STREAMS)
                if changed is not None:
                    self.remote_max_streams = changed.new_value
                    if not self.obey_stream_limit:
                        self.conn.remote_settings[SettingCodes.MAX_CONCURRENT_STREAMS] = 2**31 - 1
                        self.conn.remote_settings.acknowledge()
        await self.flush()

    async def until(self, predicate) -> None:
        """Read until `predicate()` holds; AssertionError if the server closes first."""
        while not predicate():
            if self.closed:
                raise AssertionError("server closed the connection first")
            await self.receive()
