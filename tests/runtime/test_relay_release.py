"""relay.forward's release point: the upstream's part is over before the client has the last byte.

A client that does not read (an HTTP/1.1 socket that is full, an h2 stream with no
window) must not hold the admission slot: `on_complete` runs before the final write
and exactly once, whatever happens after it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from proxy.core.decisions import Outcome
from proxy.errors import ClientGone, UpstreamConnectError
from proxy.http.messages import Request
from proxy.runtime import relay


class FakeResponse:
    all_received = False  # the relay's whole-answer shortcut: never taken for these (they arrive late)

    def __init__(self, status: int, headers, chunks: list[bytes]) -> None:
        self.status, self.headers, self.http_version = status, headers, "1.1"
        self._chunks = list(chunks)

    async def receive(self) -> bytes:
        await trio.lowlevel.checkpoint()
        return self._chunks.pop(0) if self._chunks else b""


class FakePool:
    def __init__(self, response: FakeResponse | None = None, refuse: bool = False) -> None:
        self.response, self.refuse = response, refuse

    def authority(self, upstream: int) -> bytes:
        return b"pod:8000"

    @asynccontextmanager
    async def request(self, upstream, method, target, headers, body):
        if self.refuse:
            raise UpstreamConnectError("refused", upstream="pod")
        yield self.response


class StuckClient:
    """A sink whose writes wait until `release` (a client that is not reading)."""

    def __init__(self, fail: bool = False) -> None:
        self.release, self.fail = trio.Event(), fail
        self.headers_sent = False
        self.calls: list[str] = []

    async def _write(self, what: str) -> None:
        self.calls.append(what)
        await self.release.wait()
        if self.fail:
            raise ClientGone("client went away")

    async def respond(self, status, headers, body=b"") -> None:
        self.headers_sent = True
        await self._write("respond")

    async def start(self, status, headers) -> None:
        self.headers_sent = True
        self.calls.append("start")

    async def send(self, data) -> None:
        self.calls.append("send")

    async def end(self) -> None:
        await self._write("end")


def request() -> Request:
    return Request(b"POST", b"/v1/chat", [], body=None, client="192.0.2.1")


@pytest.mark.parametrize(
    "response",
    [
        FakeResponse(200, [(b"content-length", b"2")], [b"{}"]),  # whole: one respond()
        FakeResponse(200, [], [b"data: a\n\n", b"data: b\n\n"]),  # streamed: start, send, end
    ],
    ids=["whole", "streamed"],
)
async def test_the_slot_is_released_before_the_last_write_to_a_stuck_client(response, autojump_clock):
    client, released = StuckClient(), []
    async with trio.open_nursery() as nursery:
        results = []

        async def run() -> None:
            results.append(
                await relay.forward(FakePool(response), 0, 60.0, request(), b"", client, [], None, released.append)
            )

        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        assert client.calls[-1] in ("respond", "end")  # the last write is stuck ...
        assert [r.outcome for r in released] == [Outcome.SUCCESS]  # ... and the slot is free already
        client.release.set()
    assert results == released


async def test_a_client_that_fails_after_the_release_is_released_once(autojump_clock):
    client, released = StuckClient(fail=True), []
    client.release.set()
    response = FakeResponse(200, [(b"content-length", b"2")], [b"{}"])
    with pytest.raises(ClientGone):
        await relay.forward(FakePool(response), 0, 60.0, request(), b"", client, [], None, released.append)
    assert len(released) == 1


async def test_an_answer_of_the_sidecar_releases_too(autojump_clock):
    client, released = StuckClient(), []
    client.release.set()
    result = await relay.forward(FakePool(refuse=True), 0, 60.0, request(), b"", client, [], None, released.append)
    assert released == [result] and result.outcome is Outcome.REFUSED and result.status == 502
