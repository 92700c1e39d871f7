"""An in-process transport: drive a `proxy.http.messages.Handler` with no sockets.

Theory of operation: `HandlerTransport(handler, nursery)` is what the runner's
workers send through when the target is a handler in the same trio run (the
simulated pod's `PodAPI`, the sidecar's request path, a test double). Each
request runs the handler in its own task, as the server would, with a
`Request` whose body is the shape's bytes and a sink that feeds a response
object: `status`/`headers` once the handler starts its answer, then body
chunks as it sends them, so TTFT and TPOT are measured as on a wire. Closing a
response before its end (client timeout) marks the request `client_gone` and
cancels the handler, exactly like the server on a disconnect.

Under trio's MockClock/autojump_clock every time is virtual, so runtime tests of
whole sweeps (knee, lateness, goodput) are exact and instant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator

import trio

from proxy.errors import UpstreamProtocolError
from proxy.http.messages import Handler, Headers, Request
from proxy.loadtest.shapes import Shape
from proxy.loadtest.target import prepare


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self.content_length: int | None = len(data)

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._data:
            yield self._data

    async def read_all(self) -> bytes:
        return self._data


class InprocResponse:
    """The response side the runner reads; also the `ResponseSink` the handler writes."""

    http_version = "1.1"

    def __init__(self, scope: trio.CancelScope, request: Request) -> None:
        self.status = 0
        self.headers: Headers = []
        self.headers_sent = False
        self._chunks: deque[bytes] = deque()
        self._ended = False
        self._failed = False
        self._event = trio.Event()
        self._head = trio.Event()
        self._scope = scope
        self._request = request
        self.closed = False

    # --- ResponseSink (the handler's side) ---
    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        await self.start(status, headers)
        if body:
            await self.send(body)
        await self.end()

    async def start(self, status: int, headers: Headers) -> None:
        self.status, self.headers, self.headers_sent = status, list(headers), True
        self._head.set()

    async def send(self, data: bytes) -> None:
        self._chunks.append(bytes(data))
        self._event.set()

    async def end(self) -> None:
        self._ended = True
        self._event.set()

    async def trailers(self, headers) -> None:
        await self.end()  # the load generator counts responses; trailer fields say nothing it measures

    def fail(self) -> None:
        self._failed = True
        self._head.set()
        self._event.set()

    # --- UpstreamResponse (the runner's side) ---
    async def receive(self) -> bytes:
        while True:
            if self._chunks:
                return self._chunks.popleft()
            if self._ended:
                return b""
            if self._failed:
                raise UpstreamProtocolError("in-process handler failed mid-response", request_sent=True)
            self._event = trio.Event()
            await self._event.wait()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self._ended:
            self._request.client_gone = True
            self._scope.cancel()


class _Session:
    def __init__(self, transport: HandlerTransport) -> None:
        self._t = transport

    async def send(self, shape: int, key: bytes | None) -> InprocResponse:
        return await self._t.send(shape, key)

    def close(self) -> None:
        pass


class HandlerTransport:
    def __init__(
        self, handler: Handler, shapes: tuple[Shape, ...], nursery: trio.Nursery, url: str = "http://inproc:80"
    ) -> None:
        self.handler = handler
        self.prepared = prepare(shapes, url)
        self._nursery = nursery
        self.requests = 0

    def session(self) -> _Session:
        return _Session(self)

    async def send(self, shape: int, key: bytes | None) -> InprocResponse:
        p = self.prepared[shape]
        headers = p.h1_headers if key is None else [*p.h1_headers, (b"idempotency-key", key)]
        request = Request(p.method, p.target, headers, _Body(p.body), received_at=trio.current_time())
        scope = trio.CancelScope()
        resp = InprocResponse(scope, request)
        self.requests += 1
        self._nursery.start_soon(self._serve, request, resp, scope)
        try:
            await resp._head.wait()
        except BaseException:
            await resp.aclose()
            raise
        if resp._failed and not resp.headers_sent:
            raise UpstreamProtocolError("in-process handler failed before answering", request_sent=True)
        return resp

    async def _serve(self, request: Request, resp: InprocResponse, scope: trio.CancelScope) -> None:
        with scope:
            try:
                await self.handler(request, resp)
            except Exception:
                resp.fail()
                return
        if resp._ended or resp._failed:
            return
        if resp.headers_sent or scope.cancelled_caught:
            resp.fail()  # an unfinished answer: the server would abort the stream
        else:
            await resp.respond(500, [])  # the server finishes a handler that never answered

    def close(self) -> None:
        pass

    def statistics(self) -> dict[str, int]:
        return {"requests": self.requests}
