"""AsyncClient and AsyncResilientTransport under asyncio and under trio.

Trio tests are plain `async def` (pytest-trio's trio_mode); asyncio variants run
`asyncio.run(...)` inside a sync test. The same scenarios run on both, through
the same engine, so the decisions must match exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
import trio
import trio.testing

from client_sdk import (
    AsyncClient,
    AsyncResilientTransport,
    DeadlineExceeded,
    Overloaded,
    RetryConfig,
    ThrottledLocally,
    wire,
)
from tests.client_sdk.fakes import FakeTime, FixedRandom, Script, counting_keys, fails, ok, rejected

Scenario = Callable[[], Awaitable[None]]


def make(script: Script, time: FakeTime, **config: object) -> AsyncClient:
    return AsyncClient(
        "http://pod.test",
        config=RetryConfig(**config),
        transport=httpx.MockTransport(script),  # type: ignore[arg-type]
        clock=time.clock,
        sleep=time.asleep,
        rng=FixedRandom(0.5),
        key_factory=counting_keys(),
    )


async def retries_then_succeeds() -> None:
    time = FakeTime()
    script = Script(
        fails(httpx.ConnectError),
        rejected(wire.Reason.QUEUE_FULL, retry_after_ms=500),
        ok(),
        time=time,
    )
    async with make(script, time, backoff_base_s=0.25) as client:
        response = await client.post("/v1/chat", json={}, priority="batch")
    assert response.json() == {"ok": True}
    assert time.sleeps == [0.125, 0.5 + 0.25]
    assert script.header(wire.IDEMPOTENCY_KEY) == ["key-1"] * 3
    assert script.header(wire.PRIORITY) == ["batch"] * 3
    assert client.statistics().retries == 2


async def overloaded_after_attempts() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.NOT_READY, retry_after_ms=100), time=time)
    async with make(script, time) as client:
        with pytest.raises(Overloaded) as caught:
            await client.get("/v1/models")
    assert (caught.value.reason, caught.value.attempts, script.attempts) == ("not_ready", 3, 3)


async def throttled_locally() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.QUEUE_FULL), time=time)
    async with make(script, time, max_attempts=1, throttle_min_requests=2) as client:
        for _ in range(2):
            with pytest.raises(Overloaded):
                await client.get("/v1/models")
        with pytest.raises(ThrottledLocally):
            await client.get("/v1/models")
    assert script.attempts == 2


async def streams() -> None:
    time = FakeTime()
    script = Script(fails(httpx.ConnectError), ok(), time=time)
    async with make(script, time) as client, client.stream("GET", "/v1/models") as response:
        assert await response.aread() == b'{"ok":true}'
    assert script.attempts == 2


SCENARIOS = [retries_then_succeeds, overloaded_after_attempts, throttled_locally, streams]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_asyncio(scenario: Scenario) -> None:
    asyncio.run(scenario())


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_trio(scenario: Scenario) -> None:
    with trio.fail_after(5):
        await scenario()


async def test_default_clock_and_sleep_follow_trios_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No injected time: anyio.sleep and anyio.current_time are trio's, so waits are exact."""
    script = Script(fails(httpx.ConnectError))
    transport = AsyncResilientTransport(
        httpx.MockTransport(script), RetryConfig(backoff_base_s=0.25), rng=FixedRandom(0.5)
    )
    start = trio.current_time()
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://pod.test/v1/models")
    assert trio.current_time() - start == 0.125 + 0.25


async def test_the_deadline_bounds_an_attempt_in_flight_under_trio(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def hangs(request: httpx.Request) -> httpx.Response:
        await trio.sleep(60)
        return httpx.Response(200)

    transport = AsyncResilientTransport(httpx.MockTransport(hangs))
    start = trio.current_time()
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(DeadlineExceeded):
            await client.get("http://pod.test/v1/models", headers={wire.REQUEST_TIMEOUT_MS: "1500"})
    assert trio.current_time() - start == pytest.approx(1.5)
    assert transport.statistics().attempts == 1


async def test_cancellation_during_the_backoff_sleep_stops_the_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script(fails(httpx.ConnectError))
    transport = AsyncResilientTransport(
        httpx.MockTransport(script), RetryConfig(backoff_base_s=10.0), rng=FixedRandom(0.5)
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with trio.move_on_after(1.0) as scope:
            await client.get("http://pod.test/v1/models")
    assert scope.cancelled_caught
    assert script.attempts == 1
    assert transport.statistics().gave_up == {}


def test_the_deadline_bounds_an_attempt_in_flight_under_asyncio() -> None:
    async def hangs(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        return httpx.Response(200)

    async def main() -> None:
        transport = AsyncResilientTransport(httpx.MockTransport(hangs))
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(DeadlineExceeded):
                await client.get("http://pod.test/v1/models", headers={wire.REQUEST_TIMEOUT_MS: "50"})

    asyncio.run(asyncio.wait_for(main(), 10))
