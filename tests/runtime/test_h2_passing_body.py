"""A request body passed upstream as it arrives (h2stream.PassingBody): flow control and bounds.

Over in-memory streams on trio's autojump clock, with a handler that plays the upstream
upload: it takes chunks from `request.body.passing()` when the test says (a slow upstream).
What must hold (issue 17 item 4 with issue 13's bounds): the client's window reopens only
as chunks are taken (one chunk behind: once the upload asks for the next), the connection's
body budget counts what is held, not what went through, listen.max_body_bytes still bounds
the whole body, a stall past body_timeout_s resets the stream, and a stream that ends with a
chunk taken but not acknowledged gives its window back.
"""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes

from proxy.errors import BodyTooLarge
from proxy.http.h2stream import PassingBody
from proxy.runtime import passthrough
from proxy.runtime.fields import Fields
from tests.runtime.test_h2_limits import LIMITS, connection

CHUNK = 16_384
GRPC = [(b"content-type", b"application/grpc")]


class Upload:
    """A handler that takes one chunk of its passing body per `take()`, and records what it got."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.error: BaseException | None = None
        self.body: PassingBody | None = None
        self.ended = False
        self._want = trio.Semaphore(0)

    def take(self, n: int = 1) -> None:
        for _ in range(n):
            self._want.release()

    async def __call__(self, request, sink) -> None:
        self.body = request.body.passing()
        try:
            while True:
                await self._want.acquire()
                try:
                    self.got.append(await self.body.__anext__())
                except StopAsyncIteration:
                    self.ended = True
                    break
        except Exception as exc:
            self.error = exc
            raise
        await sink.respond(200, [], b"%d" % sum(map(len, self.got)))


def spy_acks(conn) -> list[int]:
    """The flow-controlled lengths the connection acknowledges to the client, in order (h2 itself
    batches them into WINDOW_UPDATEs of half a window, so the frames alone would say little)."""
    acks: list[int] = []
    acknowledge = conn.acknowledge

    def spy(flow_len: int, sid: int) -> None:
        acks.append(flow_len)
        acknowledge(flow_len, sid)

    conn.acknowledge = spy
    return acks


async def test_the_clients_window_reopens_only_as_the_upload_takes_chunks(autojump_clock):
    upload = Upload()
    async with connection(upload) as (peer, conn, _, _):
        acks = spy_acks(conn)
        sid = await peer.request(method=b"POST", headers=GRPC, end=False)
        for _ in range(3):
            await peer.send(sid, b"x" * CHUNK)
        await trio.testing.wait_all_tasks_blocked()
        upload.take()
        await trio.testing.wait_all_tasks_blocked()
        assert len(upload.got) == 1 and acks == []  # taken by the upload, not yet gone up: not acknowledged
        upload.take()
        await trio.testing.wait_all_tasks_blocked()
        assert acks == [CHUNK]  # asking for the next: the first went up
        upload.take(2)
        await trio.testing.wait_all_tasks_blocked()
        assert acks == [CHUNK] * 3 and len(upload.got) == 3 and not upload.ended  # the client has not ended
        await peer.send(sid, b"", end=True)
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].body == b"%d" % (3 * CHUNK) and upload.ended


async def test_the_connections_body_budget_counts_what_is_held_not_what_went_up(autojump_clock):
    upload = Upload()
    async with connection(upload) as (peer, conn, _, _):
        sid = await peer.request(method=b"POST", headers=GRPC, end=False)
        await peer.send(sid, b"x" * CHUNK * 2)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.body_bytes == 2 * CHUNK
        upload.take()
        await trio.testing.wait_all_tasks_blocked()
        assert conn.body_bytes == 2 * CHUNK - len(upload.got[0])
        upload.take()
        await trio.testing.wait_all_tasks_blocked()
        assert conn.body_bytes == 0
        await peer.send(sid, b"", end=True)
        upload.take()
        await peer.until(lambda: peer.streams[sid].ended)
        assert conn.body_bytes == 0


async def test_max_body_bytes_still_bounds_the_whole_passing_body(autojump_clock):
    limits = msgspec.structs.replace(LIMITS, max_body_bytes=100_000)
    upload = Upload()
    async with connection(upload, limits) as (peer, conn, _, _):
        sid = await peer.request(method=b"POST", headers=GRPC, end=False)
        sent = 0
        while upload.error is None and peer.streams[sid].status == 0:
            if peer.conn.local_flow_control_window(sid) < CHUNK:
                upload.take(4)
                await trio.testing.wait_all_tasks_blocked()
                with trio.move_on_after(0.01):
                    await peer.receive()
                continue
            await peer.send(sid, b"x" * CHUNK)
            sent += CHUNK
            upload.take()
            await trio.testing.wait_all_tasks_blocked()
        await peer.until(lambda: peer.streams[sid].status != 0)
        assert isinstance(upload.error, BodyTooLarge)
        assert 100_000 < sent <= 100_000 + 2 * CHUNK
        # A gRPC request: 413's gRPC form (trailers-only RESOURCE_EXHAUSTED), which grpcio reads as such.
        assert peer.streams[sid].status == 200 and peer.streams[sid].header(b"grpc-status") == b"8"


async def test_a_passing_body_that_stalls_is_reset_after_body_timeout(autojump_clock):
    upload = Upload()
    async with connection(upload) as (peer, conn, _, metrics):
        sid = await peer.request(method=b"POST", headers=GRPC, end=False)
        await peer.send(sid, b"x" * 10)
        upload.take(2)  # the second waits for bytes that never come
        sent = trio.current_time()
        await peer.until(lambda: peer.streams[sid].reset_code is not None)
        assert peer.streams[sid].reset_code == ErrorCodes.CANCEL
        assert trio.current_time() - sent == pytest.approx(LIMITS.body_timeout_s)
        await peer.until(lambda: not conn.streams)
        assert conn.body_bytes == 0


async def test_a_stream_that_ends_with_a_chunk_taken_gives_its_window_back(autojump_clock):
    upload = Upload()
    async with connection(upload) as (peer, conn, _, _):
        acks = spy_acks(conn)
        sid = await peer.request(method=b"POST", headers=GRPC, end=False)
        await peer.send(sid, b"x" * CHUNK)
        await peer.send(sid, b"y" * CHUNK)
        upload.take()
        await trio.testing.wait_all_tasks_blocked()
        assert acks == []  # one chunk taken, not acknowledged yet; one still held
        await peer.reset(sid)  # the client gives up: the handler is cancelled mid-upload
        await trio.testing.wait_all_tasks_blocked()
        assert not conn.streams and sum(acks) == 2 * CHUNK and conn.body_bytes == 0


@pytest.mark.parametrize(
    ("headers", "body_with_head", "batches", "streams"),
    [
        (GRPC, False, False, True),  # a gRPC stream still sending: passed on as it arrives
        (GRPC, True, False, False),  # a unary call whose DATA came with its HEADERS: read whole, as before
        ([(b"content-type", b"application/json")], False, False, False),  # not gRPC: cost needs the body
        ([*GRPC, (b"idempotency-key", b"k1")], False, False, False),  # the fingerprint needs the whole body
        (GRPC, False, True, False),  # a batching route merges whole bodies
    ],
    ids=["grpc_stream", "grpc_unary", "json", "idempotent", "batching"],
)
async def test_which_requests_pass_their_body_on(autojump_clock, headers, body_with_head, batches, streams):
    seen: list[bool] = []

    async def handler(request, sink) -> None:
        seen.append(passthrough.streamed(request, Fields.read(request.headers), lambda _request: batches) is not None)
        await sink.respond(200, [])

    async with connection(handler) as (peer, _, _, _):
        sid = await peer.request(
            method=b"POST", headers=headers, body=b"msg" if body_with_head else None, end=body_with_head
        )
        await peer.until(lambda: peer.streams[sid].status != 0)
    assert seen == [streams]
