"""An idle server's patrol sleeps until the next deadline it guards, and still meets every deadline.

The patrol (proxy/http/patrol.py) used to wake at least every 0.1 s (min(timeouts,
WATCH_AFTER_S)) whatever it guarded: ten passes a second per server on an idle
sidecar (~2 ms of CPU a second). Now it sleeps until its next deadline, and a phase
change due earlier (the first request after a quiet spell, a head) or a reload moves
its wake-up. On trio's autojump clock, so every figure is exact.
"""

from __future__ import annotations

import trio
import trio.testing

from proxy.http.server import Server
from proxy.policy.schema import Listen


async def _ok(request, sink) -> None:
    await request.body.read_all()
    await sink.respond(200, [], b"")


async def _serving(nursery, server: Server) -> tuple[str, int]:
    address = await nursery.start(server.serve, "127.0.0.1:0")
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def test_an_idle_servers_patrol_does_not_wake(autojump_clock):
    server = Server(_ok, Listen())
    patrol = server._ctx.patrol
    passes: list[float] = []
    each_pass = patrol._pass

    def counted(now: float) -> float:
        passes.append(now)
        return each_pass(now)

    patrol._pass = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await _serving(nursery, server)
        await trio.sleep(1)
        passes.clear()
        await trio.sleep(60)
        assert passes == []
        nursery.cancel_scope.cancel()


async def test_a_head_due_after_a_quiet_spell_is_still_timed_out_on_time(autojump_clock):
    server = Server(_ok, Listen(header_timeout_s=2.0))
    async with trio.open_nursery() as nursery:
        host, port = await _serving(nursery, server)
        await trio.sleep(30)  # the patrol asleep, with nothing to guard
        stream = await trio.open_tcp_stream(host, port)
        opened = trio.current_time()
        await stream.send_all(b"GET / HTTP/1.1\r\n")  # a head never finished
        answer = b""
        while chunk := await stream.receive_some(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408")
        assert 2.0 <= trio.current_time() - opened < 2.1
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_reload_to_a_shorter_timeout_applies_to_the_sleeping_patrol(autojump_clock):
    server = Server(_ok, Listen(idle_timeout_s=600.0))
    async with trio.open_nursery() as nursery:
        host, port = await _serving(nursery, server)
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 200")
        await trio.sleep(1)  # idle; the patrol sleeps until 600 s from the answer
        server.update_limits(Listen(idle_timeout_s=5.0))
        reloaded = trio.current_time()
        assert await stream.receive_some(4096) == b""  # closed quietly for idling past the new timeout
        assert trio.current_time() - reloaded < 4.1
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def _steady_client(host: str, port: int) -> None:
    """A keep-alive client sending one request every 10 ms, each answered before the next."""
    busy = await trio.open_tcp_stream(host, port)
    while True:
        await busy.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await busy.receive_some(4096)).startswith(b"HTTP/1.1 200")
        await trio.sleep(0.01)


async def test_steady_traffic_does_not_postpone_the_patrol(autojump_clock):
    """Requests arriving under WATCH_BATCH_S apart used to push the patrol's wake-up later each time
    (each one set it to its own pass time, later than the one it replaced), so under steady traffic
    the patrol never passed: a half-sent head beside a busy keep-alive client was never timed out."""
    server = Server(_ok, Listen(header_timeout_s=1.0, idle_timeout_s=60.0))
    async with trio.open_nursery() as nursery:
        host, port = await _serving(nursery, server)
        nursery.start_soon(_steady_client, host, port)
        await trio.sleep(0.5)
        slow = await trio.open_tcp_stream(host, port)
        opened = trio.current_time()
        await slow.send_all(b"GET / HTTP/1.1\r\n")  # a head never finished
        with trio.move_on_after(5):
            answer = b""
            while chunk := await slow.receive_some(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408")
        assert 1.0 <= trio.current_time() - opened < 1.1
        # Each request's entry is dropped at the pass after its watch time, so what is kept is the last
        # WATCH_AFTER_S + WATCH_BATCH_S of requests (~13 here); unpassed, it held every request's entry
        # (and its connection) for as long as the traffic lasted: ~160 here, 30,000 in 30,000 requests.
        assert len(server._ctx.patrol._running) <= 15
        await slow.aclose()
        nursery.cancel_scope.cancel()


def test_a_request_never_moves_the_patrols_wake_up_later():
    """The unit under the test above: running() only ever brings the wake-up forward."""
    from proxy.http import patrol as patrol_module

    class Conn:
        since, requests, evicted = 0.0, 0, False

    p = patrol_module.Patrol(ctx=None)
    p._wake_at = float("inf")
    due = patrol_module.WATCH_AFTER_S + patrol_module.WATCH_BATCH_S
    for i in range(200):  # a request every millisecond for 0.2 s, the patrol asleep throughout
        p.running(Conn(), 1, i / 1000)
        assert p._wake_at <= due


async def test_steady_traffic_does_not_keep_a_long_requests_hang_up_unseen(autojump_clock):
    """The same postponement left a long request without its hang-up watcher: a client that left
    went unnoticed (and its upstream exchange ran on) for as long as the other traffic lasted."""
    cancelled_at: list[float] = []

    async def handler(request, sink) -> None:
        await request.body.read_all()
        if request.target == b"/slow":
            try:
                await trio.sleep_forever()
            finally:
                cancelled_at.append(trio.current_time())
        await sink.respond(200, [], b"")

    server = Server(handler, Listen(idle_timeout_s=60.0))
    async with trio.open_nursery() as nursery:
        host, port = await _serving(nursery, server)
        nursery.start_soon(_steady_client, host, port)
        await trio.sleep(0.5)
        leaving = await trio.open_tcp_stream(host, port)
        await leaving.send_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(0.05)
        await leaving.aclose()
        left = trio.current_time()
        with trio.move_on_after(5):
            while not cancelled_at:
                await trio.sleep(0.01)
        assert cancelled_at and cancelled_at[0] - left < 0.2  # its watcher started 0.1-0.125 s after it began
        nursery.cancel_scope.cancel()
