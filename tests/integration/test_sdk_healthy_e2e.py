"""client_sdk never fails healthy traffic, against the real sidecar in front of the sim pod (issue 14).

The README's set-up as a new app team would run it: `client_sdk.Client`,
`client_sdk.AsyncClient`, and the OpenAI SDK with `ResilientTransport`, no deadline
set. The pod (llm profile, real time) answers a 4-token chat in a few tens of ms and a
300-token one in about 2 s. Before the fix, the SDK kept the last timeout hint per host
(the short calls' ~100-200 ms) and cut the long call's attempts at it: TimedOut /
openai.APITimeoutError after three attempts. And one call with a too-short deadline
(deadline_unmeetable, no Retry-After) was retried three times and then locked the
client out of healthy calls.

Attempts are counted by an inner transport (the SDK's own witness), rejections by the
sidecar's /metrics. A short call may still be cut at its own kind's hint and retried on
a busy machine (that is what the hint is for, and the retry succeeds); what must never
happen is a long call cut at the short calls' hint, or a call that fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest

import client_sdk
from proxy.testing.procs import Proc
from tests.integration.test_sdk_e2e import sidecar

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
SHORT, LONG = 4, 300
MIX = (SHORT, SHORT, SHORT, LONG, SHORT)  # the long call comes after short ones set a short hint


def messages() -> list[dict]:
    return [{"role": "user", "content": "hello there"}]


def chat(max_tokens: int) -> dict:
    return {"model": "sim-llm", "messages": messages(), "max_tokens": max_tokens}


@pytest.fixture(scope="module")
def pod() -> Iterator[Proc]:
    with Proc(["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", "1"], name="sim-pod") as p:
        yield p


@pytest.fixture(scope="module")
def proxy(pod, tmp_path_factory) -> Iterator[Proc]:
    with sidecar(pod.url(), tmp_path_factory.mktemp("sdk-healthy")) as proc:
        yield proc


class Counting(httpx.BaseTransport):
    """Inner transport counting attempts by max_tokens."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(httpx.Response(200, content=request.content).json().get("max_tokens", 0))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class AsyncCounting(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(httpx.Response(200, content=request.content).json().get("max_tokens", 0))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def rejections(proxy: Proc, reason: str) -> float:
    text = httpx.get(proxy.url("admin") + "/metrics", timeout=5).text
    line = next((x for x in text.splitlines() if x.startswith("rampmeter_rejections_total{") and reason in x), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


@contextlib.contextmanager
def openai_over(proxy: Proc, inner: httpx.BaseTransport) -> Iterator[openai.OpenAI]:
    transport = client_sdk.ResilientTransport(inner)
    oai = openai.OpenAI(
        base_url=proxy.url() + "/v1", api_key="x", max_retries=0, http_client=httpx.Client(transport=transport)
    )
    try:
        yield oai
    finally:
        oai.close()


# --- defect 1: mixed short and long calls, no deadline --------------------------------------------


def test_client_mixed_short_and_long_calls_without_a_deadline(proxy) -> None:
    inner = Counting()
    with client_sdk.Client(proxy.url(), transport=inner) as client:
        for tokens in MIX:
            response = client.post(CHAT, json=chat(tokens))
            assert response.json()["usage"]["completion_tokens"] == tokens
    assert inner.sent.count(LONG) == 1  # one attempt: no short call's hint cut it


def test_async_client_mixed_short_and_long_calls_without_a_deadline(proxy) -> None:
    inner = AsyncCounting()

    async def main() -> None:
        async with client_sdk.AsyncClient(proxy.url(), transport=inner) as client:
            for tokens in MIX:
                response = await client.post(CHAT, json=chat(tokens))
                assert response.json()["usage"]["completion_tokens"] == tokens

    asyncio.run(main())
    assert inner.sent.count(LONG) == 1


def test_openai_sdk_mixed_short_and_long_calls_without_a_deadline(proxy) -> None:
    inner = Counting()
    with openai_over(proxy, inner) as oai:
        for tokens in MIX:
            reply = oai.chat.completions.create(model="sim-llm", messages=messages(), max_tokens=tokens)
            assert reply.usage.completion_tokens == tokens
    assert inner.sent.count(LONG) == 1


# --- defects 2 and 3: an unmeetable deadline is final and locks nothing out -----------------------


def test_client_one_unmeetable_call_is_one_attempt_and_the_healthy_calls_after_it_succeed(proxy) -> None:
    inner = Counting()
    before = rejections(proxy, "deadline_unmeetable")
    with client_sdk.Client(proxy.url(), transport=inner) as client:
        with pytest.raises(client_sdk.Rejected) as caught:
            client.post(CHAT, json=chat(LONG), deadline_s=0.3)  # ~2 s of work in 0.3 s
        assert caught.value.reason == "deadline_unmeetable"
        assert "raise the deadline" in str(caught.value).lower()
        for _ in range(6):
            assert client.post(CHAT, json=chat(SHORT)).status_code == 200
        assert client.statistics().throttled_locally == 0
    assert inner.sent[0] == LONG and inner.sent.count(LONG) == 1  # the unmeetable call was not retried
    assert rejections(proxy, "deadline_unmeetable") == before + 1


def test_openai_sdk_one_unmeetable_call_is_one_attempt_and_the_healthy_calls_after_it_succeed(proxy) -> None:
    inner = Counting()
    with openai_over(proxy, inner) as oai:
        with pytest.raises(openai.InternalServerError) as caught:
            oai.chat.completions.create(
                model="sim-llm", messages=messages(), max_tokens=LONG, extra_headers={"x-request-timeout-ms": "300"}
            )
        assert caught.value.code == "deadline_unmeetable"
        for _ in range(6):
            oai.chat.completions.create(model="sim-llm", messages=messages(), max_tokens=SHORT)
    assert inner.sent[0] == LONG and inner.sent.count(LONG) == 1


def test_plain_openai_sdk_does_not_retry_an_unmeetable_deadline(proxy) -> None:
    # No client_sdk: the sidecar's x-should-retry: false stops the OpenAI SDK's own 2 retries.
    inner = Counting()
    oai = openai.OpenAI(base_url=proxy.url() + "/v1", api_key="x", http_client=httpx.Client(transport=inner))
    with pytest.raises(openai.InternalServerError) as caught:
        oai.chat.completions.create(
            model="sim-llm", messages=messages(), max_tokens=LONG, extra_headers={"x-request-timeout-ms": "300"}
        )
    oai.close()
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert inner.sent == [LONG]
