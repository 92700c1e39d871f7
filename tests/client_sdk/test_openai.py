"""The OpenAI SDK (3.x) over ResilientTransport, with a scripted MockTransport inside.

The OpenAI client's own retries are off (max_retries=0): the transport does
them, with the budget and throttle the OpenAI SDK lacks.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from client_sdk import AsyncResilientTransport, ResilientTransport, RetryConfig, wire
from tests.client_sdk.fakes import FakeTime, FixedRandom, Outcome, Script, fails, rejected

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}],
}
MESSAGES = [{"role": "user", "content": "hi"}]


def completion() -> Outcome:
    return Outcome(200, {}, json=COMPLETION)


def sync_openai(script: Script, time: FakeTime, **config: object) -> openai.OpenAI:
    transport = ResilientTransport(
        httpx.MockTransport(script),
        RetryConfig(**config),
        clock=time.clock,
        sleep=time.sleep,
        rng=FixedRandom(0.5),
    )
    return openai.OpenAI(
        api_key="test",
        base_url="http://pod.test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )


def test_retries_a_sidecar_rejection_with_one_idempotency_key() -> None:
    time = FakeTime()
    script = Script(
        rejected(wire.Reason.QUEUE_FULL, retry_after_ms=300),
        fails(httpx.ConnectError),
        completion(),
        time=time,
    )
    client = sync_openai(script, time)
    reply = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        extra_headers={wire.PRIORITY: "interactive"},
    )
    assert reply.choices[0].message.content == "hello"
    assert script.attempts == 3
    keys = script.header(wire.IDEMPOTENCY_KEY)
    assert keys[0] is not None and keys == [keys[0]] * 3
    assert script.header(wire.PRIORITY) == ["interactive"] * 3
    assert time.sleeps == [0.3 + 0.05, 0.1]


def test_the_sidecars_error_body_surfaces_as_an_openai_error() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.TENANT_QUOTA, retry_after_ms=100), time=time)
    with pytest.raises(openai.RateLimitError) as caught:
        sync_openai(script, time).chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 429
    assert caught.value.code == "tenant_quota"
    assert script.attempts == 3


def test_a_deadline_header_bounds_the_call_and_surfaces_as_a_timeout() -> None:
    time = FakeTime()
    script = Script(fails(httpx.ConnectError), time=time)
    with pytest.raises(openai.APITimeoutError):
        sync_openai(script, time).chat.completions.create(
            model="m",
            messages=MESSAGES,
            extra_headers={wire.REQUEST_TIMEOUT_MS: "60"},
        )
    assert script.attempts == 2  # waits 0.05 then 0.1: the second wait would pass 60 ms


def test_async_openai_under_asyncio() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.DRAINING), completion(), time=time)

    async def main() -> str | None:
        transport = AsyncResilientTransport(
            httpx.MockTransport(script), clock=time.clock, sleep=time.asleep, rng=FixedRandom(0.5)
        )
        client = openai.AsyncOpenAI(
            api_key="test",
            base_url="http://pod.test/v1",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)
        await client.close()
        return reply.choices[0].message.content

    assert asyncio.run(main()) == "hello"
    assert script.attempts == 2
