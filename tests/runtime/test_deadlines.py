"""Deadlines without a cancel scope per request: the keeper, the HTTP/1.1 pool, the h1 server's slow writes.

The keeper with fake victims; the pool against raw loopback upstreams and the server
against a raw loopback client, all on trio's autojump clock (a socket wait is a
blocked task, so virtual time jumps to the next deadline and every time is exact).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from proxy.errors import UpstreamTimeout
from proxy.http.deadlines import DeadlineKeeper
from proxy.http.pool import UpstreamPool
from proxy.http.server import Server
from proxy.metrics import Metrics
from proxy.policy.schema import Listen, Upstream

HOST = [(b"host", b"upstream.test")]


class Victim:
    def __init__(self) -> None:
        self.at: float | None = None

    def deadline_passed(self) -> None:
        self.at = trio.current_time()


async def test_the_keeper_fires_each_armed_deadline_once_at_its_time(autojump_clock):
    keeper = DeadlineKeeper()
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        start = trio.current_time()
        late, early, disarmed = Victim(), Victim(), Victim()
        keeper.arm(start + 10, late)
        await trio.sleep(1)
        keeper.arm(start + 3, early)  # earlier than what the keeper sleeps for: it is woken
        keeper.disarm(keeper.arm(start + 5, disarmed))
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert (early.at, late.at, disarmed.at) == (start + 3, start + 10, None)
    assert keeper.fired == 2


async def test_disarmed_entries_do_not_pile_up(autojump_clock):
    keeper = DeadlineKeeper()
    live = Victim()
    keeper.arm(trio.current_time() + 1000, live)
    for _ in range(10_000):
        keeper.disarm(keeper.arm(trio.current_time() + 100, Victim()))
    assert len(keeper._heap) < 200  # rebuilt as the dead outnumber the live
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        await trio.sleep(2000)
        nursery.cancel_scope.cancel()
    assert live.at is not None and keeper.fired == 1


@asynccontextmanager
async def upstream(handler, **cfg):
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            registry = CollectorRegistry()
            async with UpstreamPool(
                [Upstream(url=f"http://127.0.0.1:{port}", **cfg)], metrics=Metrics(registry)
            ) as pool:
                yield pool, registry
            nursery.cancel_scope.cancel()


async def test_an_exchange_past_its_deadline_fails_then_and_the_upstream_sees_the_close(autojump_clock):
    closed = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the request; never answered
        while await stream.receive_some(65536):
            pass
        closed.set()

    async with upstream(silent) as (pool, registry):
        start = trio.current_time()
        with pytest.raises(UpstreamTimeout) as info:
            async with pool.request(0, b"GET", b"/", HOST, b"", start + 2.5):
                pass
        assert trio.current_time() == pytest.approx(start + 2.5)
        assert info.value.request_sent is True
        await closed.wait()
        stats = pool.statistics()[0]
        assert (stats.open_connections, stats.outstanding) == (0, 0)
        aborted = {"upstream": "0", "outcome": "aborted"}
        assert registry.get_sample_value("rampmeter_upstream_requests_total", aborted) == 1


async def test_an_exchange_that_ends_in_time_is_disarmed_and_its_connection_kept(autojump_clock):
    async def answer(stream: trio.SocketStream) -> None:
        while await stream.receive_some(65536):
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    async with upstream(answer, idle_timeout_s=60.0) as (pool, _):
        for _ in range(3):
            async with pool.request(0, b"GET", b"/", HOST, b"", trio.current_time() + 1.0) as resp:
                assert await resp.read() == b"ok"
        await trio.sleep(10)  # past every deadline: nothing fires
        assert pool.deadlines.fired == 0
        assert pool.statistics()[0].open_connections == 1


async def test_waiting_for_a_connection_slot_ends_at_the_deadline(autojump_clock):
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with upstream(silent, max_connections=1) as (pool, _), trio.open_nursery() as nursery:
        nursery.start_soon(partial(_hold, pool))
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        with pytest.raises(UpstreamTimeout) as info:
            async with pool.request(0, b"GET", b"/", HOST, b"", start + 1.0):
                pass
        assert trio.current_time() == pytest.approx(start + 1.0)
        assert info.value.request_sent is False
        nursery.cancel_scope.cancel()


async def _hold(pool: UpstreamPool) -> None:
    async with pool.request(0, b"GET", b"/", HOST):
        pass


async def test_a_client_that_does_not_read_its_answer_is_given_up_at_the_request_deadline(autojump_clock):
    outcome: list[BaseException] = []

    async def big(request, sink):
        request.deadline = trio.current_time() + 3.0
        try:
            await sink.respond(200, [], b"x" * 50_000_000)
        except BaseException as exc:
            outcome.append(exc)
            raise

    server = Server(big, Listen())
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.serve, "127.0.0.1:0")
            host, port = address.rsplit(":", 1)
            client = await trio.open_tcp_stream(host, int(port))
            start = trio.current_time()
            await client.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # and never reads
            while server.statistics().client_disconnects == 0:
                await trio.sleep(0.5)
            assert trio.current_time() - start == pytest.approx(3.0, abs=0.6)
            nursery.cancel_scope.cancel()
    assert [type(e).__name__ for e in outcome] == ["ClientGone"]
