"""Stalled bodies evicted at the connection limit leave nothing for the cyclic garbage collector.

Under bench.attacks' stalled_bodies every accept at the limit evicts a stalled body: a
Cancelled through the handler's frames. The edge kept that exception in a local of its
own frame, which the exception's traceback holds: a reference cycle of ~50 objects per
eviction, 125,000 objects a second at the attack's rate, and the collector's passes
over them (gen-1 passes of 15-35 ms five times a second, full ones of ~250 ms every
~3 s) were the spikes in everyone else's latency. Here: the data path's edge in front
of a handler that reads the body, on a real listener on 127.0.0.1 with
max_connections = 8, and 40 stalled bodies, so 32 evictions, with the collector off;
then one collection must find no frame of the proxy's (or this handler's) code in a
cycle. On main it found 3,264 objects, 32 cycles through Edge.__call__'s frame. Cycles of
no proxy frame or type are not counted (tests/security/garbage.py); the failure message
names the types found either way.
"""

from __future__ import annotations

import gc
import socket

import trio

from proxy.http.server import Server
from proxy.policy.schema import Listen
from proxy.runtime.edge import Edge
from tests.security.garbage import collect_saving, kinds, ours

STALLED = 40
LIMIT = 8
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"


async def _reads_the_body(request, sink, fields) -> None:
    await request.body.read_all()  # as the request path does before admission: here it never comes
    await sink.respond(200, [], b"")


async def test_evicted_stalled_bodies_leave_no_cyclic_garbage():
    server = Server(Edge(_reads_the_body), Listen(max_connections=LIMIT))
    sockets: list[socket.socket] = []
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                host, port = address.rsplit(":", 1)
                for _ in range(STALLED):
                    sock = socket.create_connection((host, int(port)))
                    sock.sendall(HEAD)
                    sockets.append(sock)
                    await trio.sleep(0.01)  # accepted, read, handler waiting for the body
                while server.statistics().connections_evicted < STALLED - LIMIT:
                    await trio.sleep(0.01)
                await trio.sleep(0.1)  # the evicted ones answered 408 and closed
                found = collect_saving()
                nursery.cancel_scope.cancel()
    finally:
        gc.enable()
        for sock in sockets:
            sock.close()
    assert server.statistics().connections_evicted == STALLED - LIMIT
    named = ours(found, __file__)
    assert named == [], (
        f"{len(found)} objects in cycles after {STALLED - LIMIT} evictions: {kinds(found)}; ours {named[:8]}"
    )
