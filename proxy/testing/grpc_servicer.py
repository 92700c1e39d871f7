"""A small grpcio server for the gRPC tests and bench/grpc: raw-bytes methods, no generated code.

Theory of operation: `serve()` starts a grpcio server on a loopback port in this
process (grpcio runs its own threads, so a trio test or a benchmark keeps its
loop) with generic handlers whose messages are plain bytes, so no protoc step is
needed. Needs the [dev] extra (grpcio, grpcio-health-checking); nothing in the
sidecar imports this module.

Methods of `test.Echo` (all bytes in, bytes out):
- Unary: the request back, with initial metadata `x-echo-initial` and trailing
  metadata `x-echo-trailer` (text) and `x-echo-bin` (binary, -bin).
- ServerStream: the request is an ASCII count N: N messages b"part-<i>".
- ClientStream: the concatenation of every request message.
- Big: the request is an ASCII size: one message of that many bytes (past the
  flow-control windows).
- Fail: aborts INVALID_ARGUMENT with details and binary trailing metadata.
- Sleep: the request is milliseconds to sleep (until the call's own deadline
  or its cancellation, which is counted in `Servicer.cancelled`); trailing
  metadata `x-slept-ms` says how long.
- SlowStream: a message every N ms (the request) until the client cancels (counted).
- Bidi: each request message back as it comes (a call that ends before the client's
  stream did is counted as cancelled).
- ClientCount: client streaming; the number of messages and bytes received, as ASCII
  "N B"; `Servicer.received` counts messages as they arrive (a test can see the
  upstream reading while the client still sends).
The standard health service (`grpc.health.v1.Health`) runs beside it; its
status per service is set with `Echo.health.set(service, status)`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from proxy.testing.procs import Proc
from proxy.testing.stack import sidecar

SERVICE = "test.Echo"


@dataclass
class Servicer:
    """The method bodies, with counters the tests read."""

    sleep_capacity: threading.Semaphore | None = None  # bench: calls served at once by Sleep
    calls: int = 0
    cancelled: int = 0
    received: int = 0  # ClientCount's messages so far
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _count(self) -> None:
        with self.lock:
            self.calls += 1

    def unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._count()
        context.send_initial_metadata((("x-echo-initial", "yes"),))
        context.set_trailing_metadata((("x-echo-trailer", "done"), ("x-echo-bin", b"\x00\x01\xff")))
        return request

    def server_stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self._count()
        for i in range(int(request or b"0")):
            yield b"part-%d" % i
        context.set_trailing_metadata((("x-echo-trailer", "streamed"),))

    def client_stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        self._count()
        return b"".join(requests)

    def big(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._count()
        size = int(request)
        return (b"0123456789abcdef" * (size // 16 + 1))[:size]

    def fail(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._count()
        context.set_trailing_metadata((("x-error-detail-bin", b"\x08\x03detail"),))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request: " + request.decode("latin-1"))
        raise AssertionError("abort raises")

    def sleep(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._count()
        held = self.sleep_capacity
        if held is not None:
            held.acquire()
        try:
            until = time.monotonic() + int(request or b"0") / 1000.0
            while time.monotonic() < until:
                if not context.is_active():
                    self._cancelled()
                    return b""
                time.sleep(min(0.005, max(0.0, until - time.monotonic())))
            context.set_trailing_metadata((("x-slept-ms", request.decode("ascii") or "0"),))
            return b"slept"
        finally:
            if held is not None:
                held.release()

    def slow_stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        """A message every `request` ms until the client cancels (counted) or 10 s pass."""
        self._count()
        finished = threading.Event()
        context.add_callback(lambda: None if finished.is_set() else self._cancelled())  # runs when the call ends
        every = int(request or b"20") / 1000.0
        until = time.monotonic() + 10.0
        i = 0
        while time.monotonic() < until and context.is_active():
            yield b"tick-%d" % i
            i += 1
            time.sleep(every)
        finished.set()

    def bidi(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        self._count()
        finished = threading.Event()
        context.add_callback(lambda: None if finished.is_set() else self._cancelled())  # runs when the call ends
        yield from requests
        # A reset can end grpcio's request iterator as if the client had finished, a moment before
        # the call reads as cancelled: look again after that moment.
        time.sleep(0.05)
        if context.is_active():
            finished.set()

    def client_count(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        self._count()
        n = size = 0
        for message in requests:
            n += 1
            size += len(message)
            with self.lock:
                self.received += 1
        return b"%d %d" % (n, size)

    def _cancelled(self) -> None:
        with self.lock:
            self.cancelled += 1


def _handlers(s: Servicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(s.unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(s.server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(s.client_stream),
            "Big": grpc.unary_unary_rpc_method_handler(s.big),
            "Fail": grpc.unary_unary_rpc_method_handler(s.fail),
            "Sleep": grpc.unary_unary_rpc_method_handler(s.sleep),
            "SlowStream": grpc.unary_stream_rpc_method_handler(s.slow_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(s.bidi),
            "ClientCount": grpc.stream_unary_rpc_method_handler(s.client_count),
        },
    )


@dataclass
class Echo:
    server: grpc.Server
    port: int
    servicer: Servicer
    health: health.HealthServicer

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_serving(self, service: str = "", serving: bool = True) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set(service, status)


@contextlib.contextmanager
def serve(*, workers: int = 16, serving: bool = True, servicer: Servicer | None = None) -> Iterator[Echo]:
    """The Echo server on 127.0.0.1 (port from the OS); health SERVING for "" and test.Echo unless not `serving`."""
    s = servicer or Servicer()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    server.add_generic_rpc_handlers((_handlers(s),))
    checker = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    echo = Echo(server, port, s, checker)
    for name in ("", SERVICE):
        echo.set_serving(name, serving)
    try:
        yield echo
    finally:
        server.stop(grace=None).wait(5)


@dataclass
class Stack:
    """The Echo server, the sidecar in front of it (h2c), and a channel to each."""

    echo: Echo
    car: Proc
    direct: grpc.Channel
    via: grpc.Channel


@contextlib.contextmanager
def through_sidecar(policy: str) -> Iterator[Stack]:
    """`serve()` behind `rampmeter serve --upstream-protocol h2c` with the policy file `policy`."""
    with serve() as echo, sidecar(echo.url, policy=policy, protocol="h2c") as car:
        direct, via = channel(echo.target), channel(car.url("data").removeprefix("http://"))
        try:
            yield Stack(echo, car, direct, via)
        finally:
            direct.close()
            via.close()


def channel(target: str) -> grpc.Channel:
    """A client channel allowing large messages (the Big method)."""
    return grpc.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    )


def method(ch: grpc.Channel, name: str, kind: str = "unary_unary"):
    """A raw-bytes client callable for `test.Echo/<name>`."""
    return getattr(ch, kind)(f"/{SERVICE}/{name}")
