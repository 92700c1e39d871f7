"""The patrol: phase deadlines to the exact virtual second, the eviction order, watchers only for long requests.

Fake connections stand in for H1ServerConnection (the patrol only reads `since` and
`requests` and calls `expire` / `watch_peer`), on trio's autojump clock.
"""

from __future__ import annotations

import trio
import trio.testing

from proxy.http.patrol import WATCH_AFTER_S, Patrol
from proxy.policy.schema import Listen


class Ctx:
    limits = Listen(header_timeout_s=5.0, idle_timeout_s=30.0)


class Fake:
    def __init__(self, name: str) -> None:
        self.name, self.since, self.requests = name, 0.0, 0
        self.expired: list[tuple[str, float]] = []
        self.watched: list[int] = []

    def expire(self, reason: str) -> None:
        self.expired.append((reason, trio.current_time()))

    async def watch_peer(self, request_number: int) -> None:
        self.watched.append(request_number)

    def __repr__(self) -> str:
        return self.name


async def test_each_phase_expires_at_its_exact_deadline(autojump_clock):
    patrol = Patrol(Ctx())
    head, idle, busy = Fake("head"), Fake("idle"), Fake("busy")
    async with trio.open_nursery() as nursery:
        await nursery.start(patrol.run)
        start = trio.current_time()
        patrol.head_due(head, start)
        patrol.idle_since(idle, start)
        patrol.running(busy, 1, start)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert head.expired == [("head", start + 5.0)]
    assert idle.expired == [("idle", start + 30.0)]
    assert busy.expired == []  # a running request has no phase deadline here


async def test_a_phase_change_moves_the_deadline(autojump_clock):
    patrol = Patrol(Ctx())
    conn = Fake("conn")
    async with trio.open_nursery() as nursery:
        await nursery.start(patrol.run)
        patrol.idle_since(conn, trio.current_time())
        await trio.sleep(20)
        patrol.head_due(conn, trio.current_time())  # bytes of a head: now header_timeout_s from here
        at = trio.current_time()
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert conn.expired == [("head", at + 5.0)]


async def test_the_victim_is_the_connection_silent_longest_and_never_a_running_one(autojump_clock):
    patrol = Patrol(Ctx())
    idle, stalled_body, slow_head, busy = Fake("idle"), Fake("body"), Fake("head"), Fake("busy")
    patrol.running(busy, 1, 0.0)
    patrol.body_wait(stalled_body, 1.0)
    patrol.idle_since(idle, 2.0)
    patrol.head_due(slow_head, 3.0)
    assert [patrol.victim() for _ in range(4)] == [stalled_body, idle, slow_head, None]


async def test_only_requests_still_running_after_a_while_get_a_watcher(autojump_clock):
    patrol = Patrol(Ctx())
    short, long = Fake("short"), Fake("long")
    async with trio.open_nursery() as nursery:
        await nursery.start(patrol.run)
        now = trio.current_time()
        short.requests = long.requests = 1
        patrol.running(short, 1, now)
        patrol.running(long, 1, now)
        await trio.sleep(WATCH_AFTER_S / 2)
        short.requests = 2  # the short one finished and the next began: its entry is stale
        await trio.sleep(WATCH_AFTER_S)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert (short.watched, long.watched) == ([], [1])
    assert patrol.watchers == 1


async def test_forgotten_connections_are_neither_expired_nor_victims(autojump_clock):
    patrol = Patrol(Ctx())
    conn = Fake("conn")
    async with trio.open_nursery() as nursery:
        await nursery.start(patrol.run)
        patrol.head_due(conn, trio.current_time())
        patrol.forget(conn)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert conn.expired == [] and patrol.victim() is None
