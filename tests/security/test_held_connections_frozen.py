"""Connections held open by a flood are walked by the cyclic collector once, not at every pass.

bench.attacks' stalled_bodies keeps every connection slot full: each eviction frees a
connection's objects as its replacement makes as many, so the young passes' trigger (net
allocations) stays flat while the young list grows, and a pass every ~2.5 s walked ~90,000
objects (37-69 ms in which nothing else ran: the normal load's p99). A settled sidecar now
sweeps every heap.SWEEP_ACCEPTS accepts (proxy/http/heap.py): a young pass over what is
new, then a freeze of what survived. Here: a real listener on 127.0.0.1, a settled heap,
4 x SWEEP_ACCEPTS connections held on a stalled body (sweeps count from the SWEEP_MIN_OPEN-th);
then at most one sweep's worth of them may still be in a generation the collector walks. On main all of them were.
"""

from __future__ import annotations

import gc
import socket

import trio

from proxy.http import heap
from proxy.http.h1server import H1ServerConnection
from proxy.http.server import Server
from proxy.policy.schema import Listen
from proxy.runtime.edge import Edge

HELD = 4 * heap.SWEEP_ACCEPTS
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"


async def _reads_the_body(request, sink, fields) -> None:
    await request.body.read_all()  # never comes
    await sink.respond(200, [], b"")


def _walked() -> int:
    """HTTP/1.1 server connections in the generations the collector walks (not frozen)."""
    return sum(1 for o in gc.get_objects() if type(o) is H1ServerConnection)


async def test_held_connections_are_frozen_out_of_the_young_passes(monkeypatch):
    monkeypatch.setattr(heap, "SWEEPS", heap._Sweeps())
    before = gc.get_threshold()
    server = Server(Edge(_reads_the_body), Listen(max_connections=2 * HELD, body_timeout_s=60))
    sockets: list[socket.socket] = []
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                heap.settle()  # as `rampmeter serve` does once it listens
                host, port = address.rsplit(":", 1)
                for _ in range(HELD):
                    sock = socket.create_connection((host, int(port)))
                    sock.sendall(HEAD)
                    sockets.append(sock)
                while server.statistics().connections_accepted < HELD:
                    await trio.sleep(0.01)
                await trio.sleep(0.2)  # each read its head and waits for the body
                # Accepts count from the SWEEP_MIN_OPEN-th open connection on; a sweep freezes every survivor.
                counted = HELD - heap.SWEEP_MIN_OPEN + 1
                assert heap.statistics()["sweeps"] == counted // heap.SWEEP_ACCEPTS  # as /admin/stats shows them
                assert _walked() < heap.SWEEP_ACCEPTS, f"{_walked()} of {HELD} held connections still walked"
                nursery.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()
        gc.unfreeze()
        gc.set_threshold(*before)
