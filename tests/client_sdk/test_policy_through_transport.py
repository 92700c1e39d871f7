"""Backoff, Retry-After floors, deadlines, budget, throttle, keys and hooks, exactly.

All on FakeTime (the engine's clock; sleeping advances it) with stubbed or
seeded randomness, through ResilientTransport over a scripted MockTransport.
"""

from __future__ import annotations

import email.utils
import random

import httpx
import pytest

from client_sdk import (
    AttemptInfo,
    CallOptions,
    CallSummary,
    DeadlineExceeded,
    Hooks,
    ResilientTransport,
    RetryBudgetExhausted,
    RetryConfig,
    RetryInfo,
    Stop,
    wire,
)
from tests.client_sdk.fakes import (
    FakeTime,
    FixedRandom,
    Script,
    counting_keys,
    fails,
    ok,
    rejected,
    status,
)

URL = "http://pod.test/v1/completions"


def make(script: Script, time: FakeTime, rng: random.Random | None = None, **config: object) -> httpx.Client:
    transport = ResilientTransport(
        httpx.MockTransport(script),
        RetryConfig(**config),
        clock=time.clock,
        sleep=time.sleep,  # type: ignore[arg-type]
        rng=rng or FixedRandom(0.5),
        wall_clock=lambda: 1_700_000_000.0,
        key_factory=counting_keys(),
    )
    return httpx.Client(transport=transport)


def summary(response: httpx.Response) -> CallSummary:
    return response.extensions["rampmeter"]


def test_backoff_schedule_with_a_stubbed_rng() -> None:
    time = FakeTime()
    script = Script(fails(httpx.ConnectError), time=time)
    client = make(script, time, max_attempts=5, backoff_base_s=0.25, backoff_cap_s=1.0)
    with pytest.raises(httpx.ConnectError):
        client.get(URL)
    assert script.attempts == 5
    assert time.sleeps == [0.125, 0.25, 0.5, 0.5]  # 0.5 * min(1.0, 0.25 * 2**n)


def test_backoff_schedule_with_a_seeded_rng() -> None:
    time = FakeTime()
    script = Script(fails(httpx.ConnectError), time=time)
    client = make(script, time, rng=random.Random(2024))
    with pytest.raises(httpx.ConnectError):
        client.get(URL)
    expected = random.Random(2024)
    assert time.sleeps == [expected.random() * 0.1, expected.random() * 0.2]


def test_rampmeter_retry_after_ms_is_a_floor_with_jitter_above_it() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.QUEUE_FULL, retry_after_ms=1500), ok(), time=time)
    response = make(script, time, backoff_base_s=0.25).post(URL, json={})
    assert response.status_code == 200
    assert time.sleeps == [1.5 + 0.125]


def test_retry_after_http_date_is_a_floor() -> None:
    time = FakeTime()
    date = email.utils.formatdate(1_700_000_000 + 4, usegmt=True)
    script = Script(status(503, retry_after=date), ok(), time=time)
    make(script, time, backoff_base_s=0.25).get(URL)
    assert time.sleeps == [4.0 + 0.125]


def test_a_server_asking_for_too_long_a_wait_ends_the_call_with_its_answer() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.NOT_READY, retry_after_ms=120_000), ok(), time=time)
    response = make(script, time, max_wait_s=30.0).get(URL)
    assert (response.status_code, script.attempts, summary(response).stop) == (
        503,
        1,
        Stop.WAIT_TOO_LONG,
    )
    assert time.sleeps == []


def test_each_attempt_sends_the_remaining_budget_and_times_out_at_most_then() -> None:
    time = FakeTime()
    attempt = fails(httpx.ConnectError)
    attempt.advance_s = 0.25
    script = Script(attempt, time=time)
    client = make(script, time, max_attempts=3, backoff_base_s=0.125)
    with pytest.raises(httpx.ConnectError):
        client.get(URL, extensions=CallOptions(deadline_s=2.0).extensions())
    # 2.0; then 2.0 - 0.25 - 0.0625; then that - 0.25 - 0.125
    assert script.header(wire.REQUEST_TIMEOUT_MS) == ["2000", "1687", "1312"]
    assert [t["read"] for t in script.timeouts] == [2.0, 1.6875, 1.3125]


def test_per_attempt_timeout_follows_the_hint_for_this_kind_only_without_a_deadline() -> None:
    time = FakeTime()
    script = Script(status(502, **{"x-rampmeter-timeout-hint-ms": "500"}), ok(), ok(), time=time)
    client = make(script, time)
    client.get(URL, extensions=CallOptions(deadline_s=8.0).extensions())  # learns 0.5 s for GET URL
    client.get(URL)  # no deadline: the hint (below the client's 5 s default) stands in for the default
    # A deadline is what the caller asked for: the hint never cuts below it.
    assert script.timeouts[0] == {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}
    assert script.timeouts[1] == script.timeouts[0]
    assert script.timeouts[2] == {"connect": 0.5, "read": 0.5, "write": 0.5, "pool": 0.5}
    host = client._transport.statistics().hosts["http://pod.test:80"]
    assert host.timeout_hints == {"GET /v1/completions#0": 0.5}


def test_no_retry_when_the_wait_would_pass_the_deadline() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.QUEUE_FULL, retry_after_ms=1000), ok(), time=time)
    client = make(script, time)
    response = client.post(URL, json={}, extensions=CallOptions(deadline_s=1.0).extensions())
    assert (response.status_code, script.attempts, summary(response).stop) == (
        503,
        1,
        Stop.DEADLINE,
    )
    script2 = Script(fails(httpx.ConnectError), time=time)
    with pytest.raises(DeadlineExceeded) as caught:
        make(script2, time).get(URL, extensions=CallOptions(deadline_s=0.04).extensions())
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert isinstance(caught.value, httpx.TimeoutException)


def test_a_caller_set_request_timeout_header_is_the_deadline() -> None:
    time = FakeTime()
    script = Script(ok(), time=time)
    make(script, time).get(URL, headers={wire.REQUEST_TIMEOUT_MS: "1500"})
    assert script.header(wire.REQUEST_TIMEOUT_MS) == ["1500"]
    assert script.timeouts[0]["read"] == 1.5


def test_an_expired_deadline_sends_nothing() -> None:
    time = FakeTime()
    script = Script(ok(), time=time)
    client = make(script, time)
    with pytest.raises(DeadlineExceeded):
        client.get(URL, extensions=CallOptions(deadline_s=0.0005).extensions())
    assert script.attempts == 0


def test_retry_budget_caps_retries_under_sustained_failure() -> None:
    """max 1 token, +0.25 per call, no floor: 8 failing calls earn exactly 2 retries."""
    time = FakeTime()
    script = Script(fails(httpx.ConnectError), time=time)
    client = make(
        script,
        time,
        rng=FixedRandom(0.99),
        budget_ratio=0.25,
        budget_floor_per_s=0.0,
        budget_max_tokens=1.0,
    )
    errors = []
    for _ in range(8):
        with pytest.raises(httpx.TransportError) as caught:
            client.get(URL)
        errors.append(type(caught.value))
    assert script.attempts == 10  # 8 calls + 2 retries, not 8 * 3
    # Calls 1 and 5 retried once then found the bucket empty; the rest could not retry at all.
    assert errors == [RetryBudgetExhausted] * 8
    stats = client._transport.statistics()
    assert (stats.calls, stats.attempts, stats.retries) == (8, 10, 2)
    assert stats.gave_up == {"budget": 8}


def test_budget_exhaustion_on_a_rejection_hands_back_the_response() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.OVERLOADED), time=time)
    client = make(
        script,
        time,
        rng=FixedRandom(0.99),
        budget_ratio=0.0,
        budget_floor_per_s=0.0,
        budget_max_tokens=1.0,
    )
    response = client.post(URL, json={})
    assert (response.status_code, summary(response).attempts, summary(response).stop) == (
        503,
        2,
        Stop.BUDGET,
    )


def test_adaptive_throttle_refuses_locally_when_the_server_keeps_rejecting() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.QUEUE_FULL), time=time)
    client = make(script, time, max_attempts=1, throttle_min_requests=2)
    assert client.post(URL, json={}).status_code == 503  # 1 request in the window: p = 0
    assert client.post(URL, json={}).status_code == 503  # 1 < min_requests 2: p = 0
    refused = client.post(URL, json={})  # p = 2/3, coin 0.5 -> refused
    # Answered, not raised: a synthetic 503 in the sidecar's shape that says what it is.
    assert refused.status_code == 503 and refused.headers[wire.SHOULD_RETRY] == "false"
    error = refused.json()["error"]
    assert (error["code"], error["last_reason"], error["probability"]) == ("throttled_locally", "queue_full", 0.6667)
    assert "refused locally" in error["message"]
    assert wire.REASON not in refused.headers  # not the sidecar's answer
    assert script.attempts == 2
    host = client._transport.statistics().hosts["http://pod.test:80"]
    assert (host.window_requests, host.window_accepts, host.refused_locally) == (2, 0, 1)
    assert host.last_failure == "queue_full"


def test_idempotency_keys_are_added_once_per_call_and_reused_on_every_attempt() -> None:
    time = FakeTime()
    script = Script(fails(httpx.ConnectError), fails(httpx.ConnectError), ok(), time=time)
    client = make(script, time)
    client.post(URL, json={})
    client.post(URL, json={})
    client.get(URL)
    assert script.header(wire.IDEMPOTENCY_KEY) == ["key-1", "key-1", "key-1", "key-2", None]


@pytest.mark.parametrize(
    ("method", "options", "headers", "expected"),
    [
        ("POST", CallOptions(idempotency_key=False), {}, None),
        ("POST", CallOptions(idempotency_key="mine"), {}, "mine"),
        ("POST", CallOptions(), {wire.IDEMPOTENCY_KEY: "preset"}, "preset"),
        ("GET", CallOptions(idempotency_key=True), {}, "key-1"),
        ("PATCH", CallOptions(), {}, "key-1"),
        ("PUT", CallOptions(), {}, None),
    ],
)
def test_idempotency_key_options(
    method: str, options: CallOptions, headers: dict[str, str], expected: str | None
) -> None:
    time = FakeTime()
    script = Script(ok(), time=time)
    make(script, time).request(method, URL, headers=headers, extensions=options.extensions())
    assert script.header(wire.IDEMPOTENCY_KEY) == [expected]


def test_automatic_keys_can_be_turned_off_client_wide() -> None:
    time = FakeTime()
    script = Script(ok(), time=time)
    make(script, time, auto_idempotency_key=False).post(URL, json={})
    assert script.header(wire.IDEMPOTENCY_KEY) == [None]


def test_call_options_set_priority_cost_and_tenant_without_overriding_the_caller() -> None:
    time = FakeTime()
    script = Script(ok(), time=time)
    options = CallOptions(priority="batch", cost_hint=812, tenant="team-a")
    make(script, time).get(URL, headers={wire.TENANT: "explicit"}, extensions=options.extensions())
    sent = script.headers[0]
    assert (sent[wire.PRIORITY], sent[wire.COST_HINT], sent[wire.TENANT]) == (
        "batch",
        "812",
        "explicit",
    )


class Recorder(Hooks):
    def __init__(self) -> None:
        self.events: list[object] = []

    def on_attempt(self, info: AttemptInfo) -> None:
        self.events.append(info)

    def on_retry(self, info: RetryInfo) -> None:
        self.events.append(info)

    def on_call(self, summary: CallSummary) -> None:
        self.events.append(summary)

    def on_throttled(self, host: str, probability: float) -> None:
        self.events.append(("throttled", host, probability))


def test_hooks_see_every_attempt_retry_and_call() -> None:
    time = FakeTime()
    script = Script(status(502), ok(), time=time)
    hooks = Recorder()
    transport = ResilientTransport(
        httpx.MockTransport(script),
        RetryConfig(backoff_base_s=0.25),
        clock=time.clock,
        sleep=time.sleep,
        rng=FixedRandom(0.5),
        hooks=hooks,
    )
    httpx.Client(transport=transport, timeout=None).get(URL)
    host = "http://pod.test:80"
    assert hooks.events == [
        AttemptInfo(1, host, "GET", 1, None),
        RetryInfo(1, host, 1, "gateway_failed", 0.125),
        AttemptInfo(1, host, "GET", 2, None),
        CallSummary(1, host, "GET", 2, "200", None, 0.125),
    ]


def test_statistics_and_repr_describe_the_state() -> None:
    time = FakeTime()
    script = Script(status(503), ok(), time=time)
    client = make(script, time)
    client.get(URL)
    stats = client._transport.statistics()
    assert (stats.calls, stats.attempts, stats.retries, stats.throttled_locally) == (1, 2, 1, 0)
    host = stats.hosts["http://pod.test:80"]
    # full at 10, +0.1 deposit capped, -1 for the retry, +0.05 s * 10/s refilled while waiting
    assert host.budget_tokens == pytest.approx(9.5)
    assert (host.window_requests, host.window_accepts, host.throttle_probability) == (2, 1, 0.0)
    assert "calls=1 attempts=2 retries=1" in repr(client._transport)


def test_keyboard_interrupt_is_never_retried() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    time = FakeTime()
    transport = ResilientTransport(httpx.MockTransport(handler), clock=time.clock, sleep=time.sleep)
    with pytest.raises(KeyboardInterrupt):
        httpx.Client(transport=transport).get(URL)
    assert transport.statistics().attempts == 0 and time.sleeps == []
