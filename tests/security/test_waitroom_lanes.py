"""A socket with bytes to read is not woken behind a burst of hang-ups in the wait room.

The room (proxy/http/waitroom.py) holds the stalled bodies of an attack and the idle HTTP/2
connections of normal clients alike. It woke them in the kernel's order, BATCH a pass with the
loop's idle time between full batches, so when thousands of the attacker's sockets hung up at
once, a normal client's next request waited behind all of them: under bench.attacks'
stalled_bodies, requests that reached the sidecar 0.6-0.87 s after they were sent (its own
handling of them under 61 ms, by its access log) were the attack's p99. The room now sorts what
is ready into two lanes and wakes the sockets with bytes to read first.

Here, the room itself with real sockets (socketpairs): HUNG_UP parked waits whose peers all
close, then one more whose peer sends a byte; the order in which the room wakes them.
"""

from __future__ import annotations

import gc
import socket

import trio

from proxy.http import waitroom
from proxy.http.waitroom import WaitRoom

HUNG_UP = 300


async def test_bytes_to_read_go_before_a_burst_of_hang_ups():
    room = WaitRoom()
    pairs = [socket.socketpair() for _ in range(HUNG_UP + 1)]
    order: list[int] = []

    async def park(i: int, sock: socket.socket) -> None:
        sock.setblocking(False)
        await room.receive(trio.socket.from_stdlib_socket(sock), 1024)
        order.append(i)

    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(room.run)
                for i, (ours, _) in enumerate(pairs):
                    nursery.start_soon(park, i, ours)
                await trio.testing.wait_all_tasks_blocked()
                assert room.waiting == HUNG_UP + 1
                for _, peer in pairs[:HUNG_UP]:
                    peer.close()  # all hang up at once
                pairs[HUNG_UP][1].send(b"x")  # and the last one has something to say
                while len(order) < HUNG_UP + 1:
                    await trio.sleep(0.001)
                nursery.cancel_scope.cancel()
    finally:
        for ours, peer in pairs:
            ours.close()
            peer.close()
    assert sorted(order) == list(range(HUNG_UP + 1))  # every wait ended
    assert order.index(HUNG_UP) < waitroom.BATCH, f"woken {order.index(HUNG_UP) + 1}th of {HUNG_UP + 1}"


async def test_a_burst_that_never_ends_does_not_keep_the_collector_off(autojump_clock):
    """The collector is paused from a burst's first full batch until both lanes are empty. Sockets that keep
    becoming ready (a thousand idle HTTP/2 clients each pinging 4 times a second under the flood budget, or
    stalled bodies trickling a byte a second, with the loop busy) can keep the lanes from ever emptying, and
    cyclic garbage then piled up for as long as that lasted. The pause now ends after GC_PAUSE_MAX_S."""
    room = WaitRoom()
    assert gc.isenabled()
    try:
        room._burst_begins()
        assert not gc.isenabled()
        await room._between_batches()  # the burst goes on: still paused
        assert not gc.isenabled()
        await trio.sleep(waitroom.GC_PAUSE_MAX_S)
        await room._between_batches()  # ... past GC_PAUSE_MAX_S
        assert gc.isenabled()
        room._burst_ends()
        assert gc.isenabled()
    finally:
        gc.enable()
