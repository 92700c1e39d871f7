"""Every retry / no-retry rule, through ResilientTransport over a scripted MockTransport.

Each case scripts one outcome followed by a 200 and counts the attempts the
server saw: 2 means the SDK retried, 1 means it did not.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from client_sdk import CallOptions, ResilientTransport, RetryConfig, wire
from tests.client_sdk.fakes import (
    FakeTime,
    FixedRandom,
    Outcome,
    Script,
    fails,
    ok,
    rejected,
    status,
)

RETRIED, NOT_RETRIED = 2, 1


def send(first: Outcome, method: str = "POST", key: bool | None = None, content: object = b"{}") -> Script:
    time = FakeTime()
    script = Script(first, ok(), time=time)
    transport = ResilientTransport(
        httpx.MockTransport(script),
        RetryConfig(),
        clock=time.clock,
        sleep=time.sleep,
        rng=FixedRandom(0.5),
    )
    extensions = {} if key is None else CallOptions(idempotency_key=key).extensions()
    with httpx.Client(transport=transport) as client:
        request = client.build_request(
            method,
            "http://pod.test/v1/x",
            content=content if method != "GET" else None,
            extensions=extensions,
        )
        try:
            client.send(request).read()
        except httpx.HTTPError:
            pass  # the attempt count is the assertion; outcomes are tested in test_client.py
    return script


ALWAYS = [
    ("connect error", fails(httpx.ConnectError)),
    ("connect timeout", fails(httpx.ConnectTimeout)),
    *[(f"503/429 {r}", rejected(r, 100)) for r in sorted(wire.RETRYABLE_REASONS)],
]
IF_SAFE = [
    ("read timeout", fails(httpx.ReadTimeout)),
    ("read error", fails(httpx.ReadError)),
    ("write error", fails(httpx.WriteError)),
    ("remote protocol error", fails(httpx.RemoteProtocolError)),
    ("502", status(502)),
    ("504", status(504)),
    ("502 upstream_unavailable", rejected(wire.Reason.UPSTREAM_UNAVAILABLE)),
    ("504 upstream_timeout", rejected(wire.Reason.UPSTREAM_TIMEOUT)),
    ("503 without a reason", status(503)),
    ("429 without a reason", status(429)),
]
NEVER = [
    ("200", ok()),
    ("500", status(500)),
    ("404", status(404)),
    ("pool timeout", fails(httpx.PoolTimeout)),
    ("local protocol error", fails(httpx.LocalProtocolError)),
    ("504 deadline_expired", rejected(wire.Reason.DEADLINE_EXPIRED)),
    ("422 idempotency_key_reused", rejected(wire.Reason.IDEMPOTENCY_KEY_REUSED)),
    ("400 bad_request", rejected(wire.Reason.BAD_REQUEST)),
    ("503 with an unknown reason", Outcome(503, {wire.REASON: "from_the_future"})),
]


def ids(cases: list[tuple[str, Outcome]]) -> list[str]:
    return [name for name, _ in cases]


@pytest.mark.parametrize(("name", "outcome"), ALWAYS, ids=ids(ALWAYS))
def test_not_run_outcomes_are_retried_even_for_post_without_a_key(name: str, outcome: Outcome) -> None:
    assert send(outcome, "POST", key=False).attempts == RETRIED


@pytest.mark.parametrize(("name", "outcome"), IF_SAFE, ids=ids(IF_SAFE))
def test_maybe_run_outcomes_are_retried_for_idempotent_methods(name: str, outcome: Outcome) -> None:
    assert send(outcome, "GET").attempts == RETRIED
    assert send(outcome, "PUT").attempts == RETRIED


@pytest.mark.parametrize(("name", "outcome"), IF_SAFE, ids=ids(IF_SAFE))
def test_maybe_run_outcomes_are_retried_for_post_with_a_key(name: str, outcome: Outcome) -> None:
    assert send(outcome, "POST").attempts == RETRIED  # automatic key
    assert send(outcome, "POST", key="caller-key").attempts == RETRIED


@pytest.mark.parametrize(("name", "outcome"), IF_SAFE, ids=ids(IF_SAFE))
def test_maybe_run_outcomes_are_not_retried_for_post_without_a_key(name: str, outcome: Outcome) -> None:
    assert send(outcome, "POST", key=False).attempts == NOT_RETRIED


@pytest.mark.parametrize(("name", "outcome"), NEVER, ids=ids(NEVER))
def test_final_outcomes_are_never_retried(name: str, outcome: Outcome) -> None:
    assert send(outcome, "GET").attempts == NOT_RETRIED
    assert send(outcome, "POST").attempts == NOT_RETRIED


def test_a_body_that_cannot_be_replayed_is_not_retried() -> None:
    def upload() -> Iterator[bytes]:
        yield b"chunk"

    assert send(fails(httpx.ConnectError), "POST", content=upload()).attempts == NOT_RETRIED
    assert send(rejected(wire.Reason.QUEUE_FULL), "POST", content=upload()).attempts == NOT_RETRIED


class _BreaksMidStream(httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        yield b'{"partial": '
        raise httpx.ReadError("connection reset mid-body")


def test_a_streamed_response_that_started_is_never_retried() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=_BreaksMidStream())

    time = FakeTime()
    transport = ResilientTransport(httpx.MockTransport(handler), clock=time.clock, sleep=time.sleep)
    client = httpx.Client(transport=transport)
    with client.stream("GET", "http://pod.test/v1/models") as response:
        assert response.status_code == 200
        with pytest.raises(httpx.ReadError):
            response.read()
    assert len(seen) == 1
    assert time.sleeps == []
