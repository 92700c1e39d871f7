"""A server shut down while handlers wait for bodies ends them quietly.

A handler reading a body the client is slow to send, past the patrol's WATCH_AFTER_S (1 ms
here: in CI a loaded runner let the usual 0.1 s pass), asks for a watcher when its read
ends (`read_body`'s finally). At shutdown that read ends by cancellation after the patrol's nursery has closed: starting a watcher there raised
RuntimeError("Nursery is closed to new arrivals"), logged as "handler failed" for every
such request (seen in CI's log of the eviction test). Real TCP on 127.0.0.1.
"""

from __future__ import annotations

import logging
import socket

import trio

from proxy.http import patrol
from proxy.http.server import Server
from proxy.policy.schema import Listen
from proxy.runtime.edge import Edge
from tests.conftest import connect_sending

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"
WAITING = 40


async def _reads_the_body(request, sink, fields) -> None:
    await request.body.read_all()
    await sink.respond(200, [], b"")


async def test_shutdown_with_bodies_pending_logs_no_failure(caplog, monkeypatch):
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(patrol, "WATCH_AFTER_S", 0.001)  # every request watched at once
    server = Server(Edge(_reads_the_body), Listen())
    sockets: list[socket.socket] = []
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                connect_sending(sockets, address, WAITING, HEAD)
                await trio.sleep(0.2)  # each handler in read_body, a watcher wanted
                nursery.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert failures == []
