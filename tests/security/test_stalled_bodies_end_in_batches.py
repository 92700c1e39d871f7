"""Thousands of held connections dropped at once end in bounded batches, not in one scheduler pass.

Under bench.attacks' stalled_bodies the attacker holds 4,096 connections each waiting
for a request body, then exits: every socket reports EOF together, and trio woke every
connection's task in the same scheduler pass (~30 us each to read the EOF, fail the body
and close): 120-270 ms in which no other request moved, the attack's p99. The body wait
now parks its socket in the server's wait room (proxy/http/waitroom.py), which wakes at
most waitroom.BATCH (32) of them per pass. Here: HELD stalled bodies on a real listener on 127.0.0.1,
the client closes them all at once, and an instrument counts the tasks each scheduler
pass runs meanwhile. On main one pass ran ~HELD of them.
"""

from __future__ import annotations

import gc
import socket

import trio
import trio.testing
from hyperframe.frame import HeadersFrame

from proxy.http.h1server import PREFACE
from proxy.http.server import Server
from proxy.policy.schema import Listen
from tests.conftest import connect_sending

HELD = 300
BATCH = 32  # waitroom.BATCH
MOST_PER_PASS = 100  # the room wakes 32 a pass (waitroom.BATCH); each ending adds a step or two of its own
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
# GET / on stream 1 (HPACK: static :method GET, :scheme http, :path /; literal :authority x)
REQUEST = HeadersFrame(1, data=b"\x82\x86\x84\x41\x01x", flags=["END_HEADERS", "END_STREAM"]).serialize()
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"


class _StepsPerPass(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = self.exits = 0
        self.most = self.most_exits = 0

    def after_io_wait(self, timeout: float) -> None:
        self.steps = self.exits = 0

    def before_task_step(self, task) -> None:
        self.steps += 1
        self.most = max(self.most, self.steps)

    def task_exited(self, task) -> None:
        self.exits += 1
        self.most_exits = max(self.most_exits, self.exits)


async def _reads_the_body(request, sink) -> None:
    await request.body.read_all()
    await sink.respond(200, [], b"")


async def test_stalled_bodies_dropped_at_once_end_in_bounded_batches():
    server = Server(_reads_the_body, Listen(max_connections=HELD + 10), buffer_bodies=True)
    sockets: list[socket.socket] = []
    passes = _StepsPerPass()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                connect_sending(sockets, address, HELD, HEAD)
                while server.statistics().connections_http1 < HELD or len(server._ctx.patrol.bodies) < HELD:
                    await trio.sleep(0.01)  # every one accepted, its head read, waiting for its body
                trio.lowlevel.add_instrument(passes)
                for sock in sockets:
                    sock.close()  # all at once, as an attacker's exit
                while server.statistics().connections_http1:
                    await trio.sleep(0.001)
                trio.lowlevel.remove_instrument(passes)
                nursery.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()
    assert passes.most <= MOST_PER_PASS, f"one scheduler pass ran {passes.most} tasks as {HELD} clients left"


async def test_idle_h2_connections_dropped_at_once_end_in_bounded_batches():
    server = Server(_reads_the_body, Listen(max_connections=HELD + 10))
    sockets: list[socket.socket] = []
    passes = _StepsPerPass()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                connect_sending(sockets, address, HELD, PREFACE + SETTINGS)
                while server.statistics().connections_h2 < HELD:
                    await trio.sleep(0.01)
                # each one read the preface, answered, and waits for its first request: until nothing runs
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                trio.lowlevel.add_instrument(passes)
                for sock in sockets:
                    sock.close()
                while server.statistics().connections_h2:
                    await trio.sleep(0.001)
                trio.lowlevel.remove_instrument(passes)
                nursery.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()
    assert passes.most <= MOST_PER_PASS, f"one scheduler pass ran {passes.most} tasks as {HELD} clients left"


async def test_h2_connections_idle_after_their_streams_dropped_at_once_end_in_bounded_batches():
    """These wait in trio's own epoll (their reader began waiting while a stream ran): trio wakes them all in one
    pass, each reads its EOF (a few us), and their endings (the tasks that exit) go through in batches."""
    server = Server(_reads_the_body, Listen(max_connections=HELD + 10))
    sockets: list[socket.socket] = []
    passes = _StepsPerPass()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                connect_sending(sockets, address, HELD, PREFACE + SETTINGS + REQUEST)
                while server.statistics().requests_total < HELD:
                    await trio.sleep(0.01)
                # every stream answered and done, the connections idle: until nothing runs
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                trio.lowlevel.add_instrument(passes)
                for sock in sockets:
                    sock.close()
                while server.statistics().connections_h2:
                    await trio.sleep(0.001)
                trio.lowlevel.remove_instrument(passes)
                nursery.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()
    assert passes.most_exits <= MOST_PER_PASS, f"one scheduler pass ended {passes.most_exits} tasks as {HELD} left"


class _EndingsWithTheCollectorOn(trio.abc.Instrument):
    def __init__(self) -> None:
        self.on = True
        self.ended = self.ended_with_collector_on = 0

    def after_io_wait(self, timeout: float) -> None:
        self.on = gc.isenabled()

    def task_exited(self, task) -> None:
        self.ended += 1
        self.ended_with_collector_on += self.on


async def test_the_collector_waits_while_a_burst_of_endings_goes_through():
    """A collector pass amid the burst walks every connection still waiting for its turn, all about to be freed
    by refcount: under stalled_bodies' exit, one gen-1 pass of ~100 ms. The room pauses the collector from the
    first full batch until fewer than a batch are left: only the first and the last batch end with it on."""
    server = Server(_reads_the_body, Listen(max_connections=HELD + 10), buffer_bodies=True)
    sockets: list[socket.socket] = []
    endings = _EndingsWithTheCollectorOn()
    assert gc.isenabled()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(server.serve, "127.0.0.1:0")
                connect_sending(sockets, address, HELD, HEAD)
                while len(server._ctx.patrol.bodies) < HELD:
                    await trio.sleep(0.01)
                trio.lowlevel.add_instrument(endings)
                for sock in sockets:
                    sock.close()
                while server.statistics().connections_http1:
                    await trio.sleep(0.001)
                trio.lowlevel.remove_instrument(endings)
                nursery.cancel_scope.cancel()
    finally:
        for sock in sockets:
            sock.close()
    assert gc.isenabled()  # on again after the burst
    assert endings.ended >= HELD
    assert endings.ended_with_collector_on <= 3 * BATCH, (
        f"{endings.ended_with_collector_on} of {endings.ended} tasks ended with the collector on"
    )
