"""Response sinks for idempotent requests: record what the leader sends, play it to others.

Theory of operation: the request path writes every response, the upstream's or
the sidecar's own rejection, to a `ResponseSink`. For a dedup leader that sink is
a `RecordingSink`, which turns the calls into the dedup recording's events (head,
chunks, trailers, end), so coalesced followers, the leader's own client and later replays
all read the same event stream through `play()`. `TeeSink` writes to the client
and the recording at once, for the mode where the leader's work stops with its
client (dedup.continue_on_disconnect = false).

`play()` answers a whole, non-streamed response with one `respond()` (one write,
content-length) and streams everything else as it arrives.
"""

from __future__ import annotations

from proxy.core import dedup as events
from proxy.errors import ResponseCut
from proxy.http.messages import Headers, ResponseSink
from proxy.runtime.dedup import failure_answer


class RecordingSink:
    """A ResponseSink that records into a dedup leader's handle."""

    __slots__ = ("_handle", "headers_sent")

    def __init__(self, handle) -> None:
        self._handle = handle
        self.headers_sent = False

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        self.headers_sent = True
        self._handle.record_head(status, headers, streamed=False)
        if body:
            self._handle.record_chunk(body)

    async def start(self, status: int, headers: Headers) -> None:
        self.headers_sent = True
        self._handle.record_head(status, headers, streamed=True)

    async def send(self, data: bytes) -> None:
        if data:
            self._handle.record_chunk(data)

    async def end(self) -> None:
        pass  # the handle's finish() ends the recording

    async def trailers(self, headers: Headers) -> None:
        self._handle.record_trailers(headers)


class TeeSink:
    """Writes to the client and records; the client's pace drives both."""

    __slots__ = ("_client", "_recording")

    def __init__(self, client: ResponseSink, recording: RecordingSink) -> None:
        self._client, self._recording = client, recording

    @property
    def headers_sent(self) -> bool:
        return self._client.headers_sent

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        await self._recording.respond(status, headers, body)
        await self._client.respond(status, headers, body)

    async def start(self, status: int, headers: Headers) -> None:
        await self._recording.start(status, headers)
        await self._client.start(status, headers)

    async def send(self, data: bytes) -> None:
        await self._recording.send(data)
        await self._client.send(data)

    async def end(self) -> None:
        await self._client.end()

    async def trailers(self, headers: Headers) -> None:
        await self._recording.trailers(headers)
        await self._client.trailers(headers)


class StreamAborted(ResponseCut):
    """The recorded response failed after its head went out: the client's stream is cut (no traceback:
    the leader's failure was logged where it happened)."""


async def play(source, sink: ResponseSink) -> None:
    """Send a dedup event stream (follower, replay or the leader's own) to the client."""
    head: events.Head | None = None
    body: list[bytes] = []
    trailers: events.Trailers | None = None
    with source:
        async for event in source:
            if isinstance(event, events.Head):
                head = event
                if event.streamed:
                    await sink.start(event.status, event.headers)
            elif isinstance(event, events.Chunk):
                if head is not None and head.streamed:
                    await sink.send(event.data)
                else:
                    body.append(event.data)
            elif isinstance(event, events.Trailers):
                trailers = event
            elif isinstance(event, events.End):
                break
            else:  # Failed
                if sink.headers_sent:
                    raise StreamAborted(event.message)
                status, headers, answer = failure_answer(event)
                await sink.respond(status, headers, answer)
                return
    if head is None:
        raise StreamAborted("the recording ended without a response")
    if trailers is not None:
        if not head.streamed:  # trailers follow a streamed head only
            await sink.start(head.status, head.headers)
            await sink.send(b"".join(body))
        await sink.trailers(trailers.headers)
    elif head.streamed:
        await sink.end()
    else:
        await sink.respond(head.status, head.headers, b"".join(body))
