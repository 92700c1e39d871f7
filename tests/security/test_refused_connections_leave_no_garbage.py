"""Connections refused for a bad request, and HTTP/2 connections, leave nothing for the cyclic GC.

Under bench.attacks' bad_targets (~650 connections a second: HTTP/1.1 requests with targets
that are not origin-form, one per connection, and an HTTP/2 connection per 24 bad
`:path`s) two kinds of connection were left in reference cycles when they closed:

- an HTTP/1.1 connection whose head llhttp refused (a relative target, `GET xxxx`): the
  FramingError kept in the parser's events held its traceback and context, whose frames
  reach back to the connection's own: ~50 objects, the whole connection with its socket;
- every HTTP/2 connection: h2's connection object is a cycle of its own (its frame
  dispatch table holds its bound methods), with the streams it keeps and the HPACK
  tables: ~100 objects.

The collector's young passes, every ~90 ms under the attack, and its gen-1 passes of
7-22 ms every ~0.9 s, were mostly that garbage. Here: the attack's own requests for
2 s against a server on 127.0.0.1, the collector off; then one collection must find
nothing of the data path's (tests/security/garbage.py: cycles of other tests or libraries in
the same worker are named, not counted). On main it found ~17 objects a connection (~6,500 in
all).
"""

from __future__ import annotations

import gc
import threading

import trio

from proxy.http.server import Server
from proxy.policy.schema import Listen
from proxy.runtime.edge import Edge
from proxy.testing.attacks import IO_TIMEOUT_S, Tally, bad_targets
from tests.security.garbage import collect_saving, kinds, ours

ATTACK_S = 1.0


async def _answers(request, sink, *_) -> None:
    await request.body.read_all()
    await sink.respond(200, [], b"")


def _attack(target: tuple[str, int]) -> Tally:
    stop, tally = threading.Event(), Tally("bad_targets")
    timer = threading.Timer(ATTACK_S, stop.set)
    timer.start()
    bad_targets(target, stop, tally)
    return tally


async def test_connections_refused_for_bad_targets_and_h2_connections_leave_no_cyclic_garbage():
    server = Server(Edge(_answers), Listen(), buffer_bodies=True)
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                host, port = address.rsplit(":", 1)
                tally = await trio.to_thread.run_sync(_attack, (host, int(port)))
                # The attacker's h2 reader threads keep a closed socket open until their read times out.
                with trio.move_on_after(IO_TIMEOUT_S + 2):
                    while server.statistics().connections_h2 + server.statistics().connections_http1:
                        await trio.sleep(0.05)
                found = collect_saving()
                nursery.cancel_scope.cancel()
    finally:
        gc.enable()
    assert tally.connections > 50
    assert tally.outcomes["status:400"] > 0
    named = ours(found, __file__)
    assert named == [], (
        f"{len(found)} objects in reference cycles after {tally.connections} connections: {kinds(found)}; "
        f"ours {named[:8]}"
    )
