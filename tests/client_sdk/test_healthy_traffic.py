"""The SDK never fails healthy traffic (issue 14), through Client, AsyncClient and the OpenAI SDK.

A fake sidecar on fake time: each call takes time in proportion to the tokens it asks
for, and an attempt whose read timeout is shorter than that times out after exactly
that timeout. Answers carry the sidecar's hint for their kind (2.5 x the duration) and
its key. What the issue reproduced, each as a test:

1. one hint per host made a long call time out after short ones had set a short hint;
2. one call with a too-short deadline locked the client out of healthy calls, and a
   local refusal read, through the OpenAI SDK, as "Connection error.";
3. a deadline_unmeetable without Retry-After (the service time alone exceeds the
   budget) was retried, which cannot help, instead of ending with advice.

Header names are spelled out (not taken from client_sdk.wire) so that these tests run
unchanged against the SDK before the fix and fail there for the reason they describe.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

import client_sdk
from client_sdk import AsyncResilientTransport, ResilientTransport, RetryConfig
from tests.client_sdk.fakes import FakeTime, FixedRandom, rejected

BASE = "http://pod.test"
CHAT = "/v1/chat/completions"
SHORT, LONG = 4, 380  # max_tokens: 0.06 s and 3.8 s on this pod


def seconds_for(max_tokens: int) -> float:
    return 0.02 + 0.01 * max_tokens


def chat(max_tokens: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}


COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
}


class FakeSidecar:
    """Answers like the sidecar in front of a healthy pod, on `time`."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.attempts: list[tuple[int, float | None]] = []  # (max_tokens, read timeout) per attempt

    def __call__(self, request: httpx.Request) -> httpx.Response:
        max_tokens = json.loads(request.content)["max_tokens"]
        read = (request.extensions.get("timeout") or {}).get("read")
        self.attempts.append((max_tokens, read))
        needs = seconds_for(max_tokens)
        budget = request.headers.get("x-request-timeout-ms")
        if budget is not None and int(budget) < needs * 1000:
            return rejected(client_sdk.wire.Reason.DEADLINE_UNMEETABLE).respond(request)  # no Retry-After
        if read is not None and read < needs:
            self.time.now += read
            raise httpx.ReadTimeout("timed out", request=request)
        self.time.now += needs
        bucket = (1 + max_tokens).bit_length()
        headers = {
            "x-rampmeter-timeout-hint-ms": str(round(2500 * needs)),
            "x-rampmeter-timeout-hint-key": f"/v1/chat/completions#{bucket}",
        }
        return httpx.Response(200, headers=headers, json=COMPLETION)


def sync_client(pod: FakeSidecar, time: FakeTime) -> client_sdk.Client:
    return client_sdk.Client(
        BASE, transport=httpx.MockTransport(pod), clock=time.clock, sleep=time.sleep, rng=FixedRandom(0.5)
    )


def sync_openai(pod: FakeSidecar, time: FakeTime, config: RetryConfig | None = None) -> openai.OpenAI:
    transport = ResilientTransport(
        httpx.MockTransport(pod), config, clock=time.clock, sleep=time.sleep, rng=FixedRandom(0.5)
    )
    return openai.OpenAI(
        api_key="x", base_url=BASE + "/v1", max_retries=0, http_client=httpx.Client(transport=transport)
    )


# --- 1. a hint learned from short calls never fails a long one -----------------------------------


def test_client_mixed_short_and_long_calls_without_a_deadline_all_succeed() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)
    with sync_client(pod, time) as client:
        for tokens in (SHORT, SHORT, SHORT, LONG, SHORT, LONG):
            assert client.post(CHAT, json=chat(tokens)).status_code == 200
    assert [tokens for tokens, _ in pod.attempts] == [SHORT, SHORT, SHORT, LONG, SHORT, LONG]  # no retries


def test_async_client_mixed_short_and_long_calls_without_a_deadline_all_succeed() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)

    async def main() -> None:
        async with client_sdk.AsyncClient(
            BASE, transport=httpx.MockTransport(pod), clock=time.clock, sleep=time.asleep, rng=FixedRandom(0.5)
        ) as client:
            for tokens in (SHORT, SHORT, SHORT, LONG, SHORT, LONG):
                assert (await client.post(CHAT, json=chat(tokens))).status_code == 200

    asyncio.run(main())
    assert len(pod.attempts) == 6


def test_openai_sdk_mixed_short_and_long_calls_without_a_deadline_all_succeed() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)
    oai = sync_openai(pod, time)
    for tokens in (SHORT, SHORT, SHORT, LONG, SHORT, LONG):
        reply = oai.chat.completions.create(model="m", messages=chat(tokens)["messages"], max_tokens=tokens)
        assert reply.choices[0].message.content == "hi"
    assert len(pod.attempts) == 6


def test_async_openai_sdk_mixed_short_and_long_calls_without_a_deadline_all_succeed() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)

    async def main() -> None:
        transport = AsyncResilientTransport(
            httpx.MockTransport(pod), clock=time.clock, sleep=time.asleep, rng=FixedRandom(0.5)
        )
        async with httpx.AsyncClient(transport=transport) as http:
            oai = openai.AsyncOpenAI(api_key="x", base_url=BASE + "/v1", max_retries=0, http_client=http)
            for tokens in (SHORT, SHORT, SHORT, LONG, SHORT, LONG):
                await oai.chat.completions.create(model="m", messages=chat(tokens)["messages"], max_tokens=tokens)

    asyncio.run(main())
    assert len(pod.attempts) == 6


# --- 2. one refused call does not lock the client out ----------------------------------------


def test_client_one_unmeetable_deadline_then_healthy_calls_all_succeed() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)
    with sync_client(pod, time) as client:
        with pytest.raises(client_sdk.Rejected):
            client.post(CHAT, json=chat(LONG), deadline_s=0.5)  # 3.8 s of work in 0.5 s
        for _ in range(6):
            assert client.post(CHAT, json=chat(SHORT)).status_code == 200
        assert client.statistics().throttled_locally == 0


def test_openai_sdk_one_unmeetable_deadline_then_healthy_calls_all_succeed() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)
    oai = sync_openai(pod, time)
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(
            model="m", messages=chat(LONG)["messages"], max_tokens=LONG, extra_headers={"x-request-timeout-ms": "500"}
        )
    for _ in range(6):
        oai.chat.completions.create(model="m", messages=chat(SHORT)["messages"], max_tokens=SHORT)


def test_a_local_refusal_through_the_openai_sdk_names_itself_and_the_servers_last_reason() -> None:
    time = FakeTime()
    overloaded = rejected(client_sdk.wire.Reason.OVERLOADED, retry_after_ms=200)
    transport = ResilientTransport(
        httpx.MockTransport(overloaded.respond),
        RetryConfig(max_attempts=1),
        clock=time.clock,
        sleep=time.sleep,
        rng=FixedRandom(0.5),
    )
    oai = openai.OpenAI(
        api_key="x", base_url=BASE + "/v1", max_retries=0, http_client=httpx.Client(transport=transport)
    )
    refused = None
    for _ in range(40):  # the throttle needs its minimum count of failures first
        with pytest.raises(openai.InternalServerError) as caught:
            oai.chat.completions.create(model="m", messages=chat(SHORT)["messages"])
        if caught.value.code == "throttled_locally":
            refused = caught.value
            break
    assert refused is not None, "never refused locally"
    assert refused.status_code == 503
    assert "refused locally" in refused.message and "overloaded" in refused.message
    assert refused.body["last_reason"] == "overloaded"


# --- 3. an unmeetable deadline with no Retry-After is final -------------------------------------


def test_client_unmeetable_without_retry_after_is_one_attempt_and_says_raise_the_deadline() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)
    with sync_client(pod, time) as client, pytest.raises(client_sdk.Rejected) as caught:
        client.post(CHAT, json=chat(LONG), deadline_s=0.5)
    assert len(pod.attempts) == 1
    error = caught.value
    assert error.reason == "deadline_unmeetable" and error.attempts == 1
    assert "raise the deadline" in str(error).lower()
    assert not isinstance(error, client_sdk.Overloaded)  # not "try later": later cannot help
    assert isinstance(error, client_sdk.DeadlineUnmeetable)


def test_openai_sdk_over_the_transport_unmeetable_without_retry_after_is_one_attempt() -> None:
    time = FakeTime()
    pod = FakeSidecar(time)
    oai = sync_openai(pod, time)
    with pytest.raises(openai.InternalServerError) as caught:
        oai.chat.completions.create(
            model="m", messages=chat(LONG)["messages"], max_tokens=LONG, extra_headers={"x-request-timeout-ms": "500"}
        )
    assert len(pod.attempts) == 1
    assert caught.value.code == "deadline_unmeetable"


def test_plain_openai_sdk_with_its_default_retries_makes_one_attempt_on_a_final_rejection() -> None:
    # No client_sdk at all: x-should-retry: false is what stops the OpenAI SDK's own retries.
    time = FakeTime()
    pod = FakeSidecar(time)
    oai = openai.OpenAI(
        api_key="x", base_url=BASE + "/v1", http_client=httpx.Client(transport=httpx.MockTransport(pod))
    )
    assert oai.max_retries == 2
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(
            model="m", messages=chat(LONG)["messages"], max_tokens=LONG, extra_headers={"x-request-timeout-ms": "500"}
        )
    assert len(pod.attempts) == 1
