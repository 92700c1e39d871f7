"""Minimal upstreams whose every move a test controls: trio + h11 and trio + h2 servers, and nginx.

Theory of operation: a server runs in the test's own trio run (so the autojump
clock and `wait_all_tasks_blocked()` see it) and calls a test-supplied
`handler(exchange)` per request. The handler decides: answer, stream pieces,
stall on an event, close or reset, or wait to observe the client going away.
Servers count what they saw (connections, requests, closes, resets) so tests
assert on the upstream's view, not on timing.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import textwrap
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import h11
import hyperframe.frame
import trio

from tests.conftest import free_port, require_binary


async def _serve(nursery: trio.Nursery, handler: Callable[[trio.SocketStream], Awaitable[None]]) -> int:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


class H1Exchange:
    def __init__(
        self, server: RawH1Server, stream: trio.SocketStream, conn: h11.Connection, request: h11.Request, body: bytes
    ) -> None:
        self.server, self.stream, self.conn, self.request, self.body = server, stream, conn, request, body
        self.close_after = False  # close the connection after this exchange, without saying so

    async def respond(
        self, status: int = 200, body: bytes = b"ok", headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        hdrs = [*(headers or []), (b"content-length", b"%d" % len(body))]
        data = self.conn.send(h11.Response(status_code=status, headers=hdrs))
        await self.stream.send_all(data + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))

    async def start(self, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        hdrs = [*(headers or []), (b"transfer-encoding", b"chunked")]
        await self.stream.send_all(self.conn.send(h11.Response(status_code=status, headers=hdrs)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(self.conn.send(h11.Data(data=data)))

    async def end(self) -> None:
        await self.stream.send_all(self.conn.send(h11.EndOfMessage()))

    def reset(self) -> None:
        """Close with RST (SO_LINGER 0) rather than FIN."""
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.stream.socket.close()
        self.close_after = True

    async def wait_client_gone(self) -> None:
        """Block until the client closes its side (EOF or reset), then record it."""
        try:
            while await self.stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        self.server.client_gone.set()
        self.close_after = True


class RawH1Server:
    def __init__(self, handler: Callable[[H1Exchange], Awaitable[None]]) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[h11.Request] = []
        self.client_closes = 0  # connections the client closed (EOF between requests)
        self.closed_by_us = trio.Event()  # set whenever the server closes a connection on purpose
        self.client_gone = trio.Event()  # set by H1Exchange.wait_client_gone
        self.port = 0

    @asynccontextmanager
    async def running(self):
        async with trio.open_nursery() as nursery:
            self.port = await _serve(nursery, self._connection)
            yield self
            nursery.cancel_scope.cancel()

    async def _next(self, stream: trio.SocketStream, conn: h11.Connection) -> Any:
        while (event := conn.next_event()) is h11.NEED_DATA:
            try:
                conn.receive_data(await stream.receive_some(65536))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                conn.receive_data(b"")
        return event

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._next(stream, conn)
                if type(request) is h11.ConnectionClosed:
                    self.client_closes += 1
                    return
                body = bytearray()
                while type(event := await self._next(stream, conn)) is h11.Data:
                    body += event.data
                self.requests.append(request)
                exchange = H1Exchange(self, stream, conn, request, bytes(body))
                await self.handler(exchange)
                if exchange.close_after or conn.our_state is not h11.DONE:
                    self.closed_by_us.set()
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            self.client_closes += 1
        finally:
            stream.socket.close()


class H2Exchange:
    def __init__(self, server: RawH2Server, conn: _H2ServerConn, stream_id: int, headers: list) -> None:
        self.server, self.conn, self.stream_id = server, conn, stream_id
        self.headers = dict(headers)
        self.body = bytearray()
        self.complete = trio.Event()  # request END_STREAM seen
        self.reset_code: int | None = None
        self.reset_seen = trio.Event()
        self.trailers: list | None = None  # the request's trailer fields, if it sent any

    async def read_body(self) -> bytes:
        await self.complete.wait()
        return bytes(self.body)

    async def respond(self, status: int = 200, body: bytes = b"ok") -> None:
        await self.start(status, [(b"content-length", b"%d" % len(body))])
        await self.send(body, end=True)

    async def start(self, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.conn.h2.send_headers(self.stream_id, [(b":status", b"%d" % status), *(headers or [])])
        await self.conn.flush()

    async def send(self, data: bytes, end: bool = False) -> None:
        h = self.conn.h2
        view = memoryview(data)
        while True:
            size = min(h.local_flow_control_window(self.stream_id), h.max_outbound_frame_size, len(view))
            if size == 0 and view:
                await self.conn.window_opened.wait()
                continue
            h.send_data(self.stream_id, view[:size].tobytes(), end_stream=end and size == len(view))
            view = view[size:]
            await self.conn.flush()
            if not view:
                return

    async def reset(self, code: int) -> None:
        self.conn.h2.reset_stream(self.stream_id, code)
        await self.conn.flush()


class _H2ServerConn:
    def __init__(self, server: RawH2Server, stream: trio.SocketStream) -> None:
        self.server, self.stream = server, stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: server.max_concurrent_streams},
        )
        self.lock = trio.Lock()
        self.window_opened = trio.Event()
        self.exchanges: dict[int, H2Exchange] = {}
        self.active = 0

    async def flush(self) -> None:
        async with self.lock:
            data = self.h2.data_to_send()
            if data:
                await self.stream.send_all(data)

    async def goaway(self, last_stream_id: int) -> None:
        """A raw GOAWAY frame: h2 itself would stop serving the streams still open (python-hyper/h2#1181)."""
        frame = hyperframe.frame.GoAwayFrame(0)
        frame.last_stream_id = last_stream_id
        async with self.lock:
            await self.stream.send_all(self.h2.data_to_send() + frame.serialize())

    async def _run_exchange(self, exchange: H2Exchange) -> None:
        self.active += 1
        # Streams open as h2 counts them (SETTINGS_MAX_CONCURRENT_STREAMS' own measure), not handlers still
        # running: a handler that has sent its END_STREAM may not have returned yet when the client, having
        # read that answer, opens its next stream.
        self.server.max_active = max(self.server.max_active, self.h2.open_inbound_streams)
        try:
            await self.server.handler(exchange)
        finally:
            self.active -= 1

    async def serve(self) -> None:
        self.h2.initiate_connection()
        await self.flush()
        async with trio.open_nursery() as nursery:
            try:
                while data := await self.stream.receive_some(65536):
                    for event in self.h2.receive_data(data):
                        self._on(event, nursery)
                    await self.flush()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            self.server.closed_connections += 1
            nursery.cancel_scope.cancel()

    def _on(self, event: Any, nursery: trio.Nursery) -> None:
        if isinstance(event, h2.events.RequestReceived):
            ex = self.exchanges[event.stream_id] = H2Exchange(self.server, self, event.stream_id, event.headers)
            self.server.exchanges.append(ex)
            self.server.last_connection = self
            nursery.start_soon(self._run_exchange, ex)
        elif isinstance(event, h2.events.DataReceived):
            self.exchanges[event.stream_id].body += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            self.exchanges[event.stream_id].trailers = list(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.exchanges[event.stream_id].complete.set()
        elif isinstance(event, h2.events.StreamReset):
            ex = self.exchanges[event.stream_id]
            ex.reset_code = event.error_code
            self.server.resets.append((event.stream_id, event.error_code))
            ex.reset_seen.set()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window_opened.set()
            self.window_opened = trio.Event()


class RawH2Server:
    def __init__(self, handler: Callable[[H2Exchange], Awaitable[None]], *, max_concurrent_streams: int = 100) -> None:
        self.handler = handler
        self.max_concurrent_streams = max_concurrent_streams
        self.connections = 0
        self.closed_connections = 0
        self.exchanges: list[H2Exchange] = []
        self.resets: list[tuple[int, int]] = []
        self.max_active = 0
        self.last_connection: _H2ServerConn | None = None
        self.port = 0

    @asynccontextmanager
    async def running(self):
        async with trio.open_nursery() as nursery:
            self.port = await _serve(nursery, self._connection)
            yield self
            nursery.cancel_scope.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            await _H2ServerConn(self, stream).serve()
        finally:
            stream.socket.close()


NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
error_log {dir}/error.log;
pid {dir}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    keepalive_requests {keepalive_requests};
    server {{
        listen 127.0.0.1:{h1};
        listen 127.0.0.1:{h2} http2;
        location / {{ return 200 "$connection"; }}
        location /big {{ alias {dir}/big.bin; }}
    }}
}}
"""


@contextmanager
def nginx(tmp: Path, *, keepalive_requests: int = 1000, big_bytes: int = 0):
    """nginx on loopback: HTTP/1.1 on `h1`, h2c (prior knowledge) on `h2`; `/` answers its connection number."""
    binary = require_binary("nginx")
    (tmp / "big.bin").write_bytes(bytes(range(256)) * (big_bytes // 256))
    h1, h2c = free_port(), free_port()
    (tmp / "nginx.conf").write_text(
        textwrap.dedent(
            NGINX_CONF.format(
                dir=tmp,
                h1=h1,
                h2=h2c,
                keepalive_requests=keepalive_requests,
                # as root the workers would drop to `nobody`, which cannot read a 0700 tmp dir
                user="user root;" if os.geteuid() == 0 else "",
            )
        )
    )
    proc = subprocess.Popen(
        [binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for port in (h1, h2c):
            _wait_listening(port, proc)
        yield {"h1": h1, "h2": h2c}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nginx did not listen on {port} within 10 s")
