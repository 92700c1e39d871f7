"""Timeout hints: per kind of request, never below what the caller asked for, never failing a call.

The sidecar's `x-rampmeter-timeout-hint-ms` is 2.5 x its observed p99 for one kind of
request (route, cost bucket). The SDK used to keep one hint per host and cut every
attempt at it: after three short chats (hint 181 ms), a healthy 3.8 s generation
timed out after three attempts (issue 14). Now a hint applies only to requests of
the kind it came from, only when the caller set no deadline, and only when a cut can
be followed by a paid-for retry; the last attempt runs to the caller's own timeout.

A stale hint (the pod got slower than the p99 it came from) still backs off: a read
timeout the hint caused doubles that kind's hint, as TCP backs off its retransmission
timer, and the next response's hint replaces it. All on fake time.
"""

from __future__ import annotations

import httpx
import pytest

from client_sdk import CallOptions, Engine, ResilientTransport, RetryConfig, wire
from client_sdk.signals import Signal
from tests.client_sdk.fakes import FakeTime, FixedRandom, Script, counting_keys, fails, ok

URL = "http://pod.test/v1/completions"
HOST = "http://pod.test:80"
HINT = {wire.TIMEOUT_HINT_MS: "500", wire.TIMEOUT_HINT_KEY: "/v1/completions#5"}
SHORT = {"prompt": "hi", "max_tokens": 16}  # 1 + 16 tokens: bucket 5
LONG = {"prompt": "hi", "max_tokens": 4000}  # bucket 12: another kind


def make(script: Script, time: FakeTime, **config: object) -> tuple[httpx.Client, ResilientTransport]:
    transport = ResilientTransport(
        httpx.MockTransport(script),
        RetryConfig(**{"max_attempts": 3, "backoff_base_s": 0.0, **config}),
        clock=time.clock,
        sleep=time.sleep,  # type: ignore[arg-type]
        rng=FixedRandom(0.5),
        key_factory=counting_keys(),
    )
    return httpx.Client(transport=transport), transport


def hints_of(transport: ResilientTransport) -> dict[str, float]:
    return transport.statistics().hosts[HOST].timeout_hints


def test_a_hint_applies_only_to_requests_of_its_kind() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), ok(), ok(), time=time)
    client, transport = make(script, time)
    client.post(URL, json=SHORT)  # learns 0.5 s for short completions
    client.post(URL, json=LONG)  # another kind: no hint, the caller's own 5 s
    client.post(URL, json=SHORT)
    assert [t["read"] for t in script.timeouts] == [5.0, 5.0, 0.5]
    assert hints_of(transport) == {"POST /v1/completions#5": 0.5}


def test_a_hint_never_cuts_below_the_callers_deadline() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), ok(), time=time)
    client, _ = make(script, time)
    client.post(URL, json=SHORT)
    client.post(URL, json=SHORT, extensions=CallOptions(deadline_s=4.0).extensions())
    assert script.timeouts[1]["read"] == 4.0  # what remains of the deadline, not the 0.5 s hint


def test_the_last_attempt_runs_to_the_callers_timeout_so_a_slow_healthy_call_still_succeeds() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), fails(httpx.ReadTimeout), ok(), time=time)
    client, transport = make(script, time)
    client.post(URL, json=SHORT)
    response = client.post(URL, json=SHORT)  # cut at 0.5, then at 1.0 (backed off), then uncut
    assert response.status_code == 200
    assert [t["read"] for t in script.timeouts[1:]] == [0.5, 1.0, 5.0]
    assert hints_of(transport) == {"POST /v1/completions#5": 2.0}


def test_no_hint_when_a_cut_could_not_be_retried() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), ok(), time=time)
    client, _ = make(script, time)
    client.post(URL, json=SHORT)
    client.post(URL, json=SHORT, extensions=CallOptions(idempotency_key=False).extensions())  # POST, no key
    assert script.timeouts[1]["read"] == 5.0


def test_no_hint_when_the_budget_could_not_pay_for_the_retry() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), ok(), ok(), time=time)
    client, transport = make(script, time, budget_max_tokens=1.0, budget_floor_per_s=0.0, budget_ratio=0.0)
    client.post(URL, json=SHORT)
    client.post(URL, json=SHORT)  # takes the one token before the attempt, gives it back after
    assert transport.statistics().hosts[HOST].budget_tokens == 1.0
    transport.engine._hosts.get(HOST).budget.try_withdraw(time.now)  # someone else spent it
    client.post(URL, json=SHORT)
    assert [t["read"] for t in script.timeouts[1:]] == [0.5, 5.0]


def test_a_hint_cut_retry_is_paid_once_and_counted_as_a_retry() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), ok(), time=time)
    client, transport = make(script, time)
    client.post(URL, json=SHORT)
    client.post(URL, json=SHORT)
    stats = transport.statistics()
    assert (stats.retries, stats.hosts[HOST].budget_granted) == (1, 1)


def test_a_fresh_hint_from_the_server_replaces_the_backed_off_one() -> None:
    time = FakeTime()
    fresh = {wire.TIMEOUT_HINT_MS: "800", wire.TIMEOUT_HINT_KEY: "/v1/completions#5"}
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), ok(**fresh), ok(), time=time)
    client, transport = make(script, time)
    client.get(URL)
    client.get(URL)  # times out at 0.5, retried at 1.0, answered with a hint of 0.8
    client.get(URL)
    assert hints_of(transport) == {"GET /v1/completions#0": 0.8}
    assert script.timeouts[-1]["read"] == 0.8


def test_no_back_off_when_the_deadline_or_the_callers_timeout_cut_the_attempt() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), time=time)
    client, transport = make(script, time)
    client.get(URL)
    with pytest.raises(httpx.ReadTimeout):
        client.get(URL, extensions=CallOptions(deadline_s=0.3).extensions())
    assert hints_of(transport) == {"GET /v1/completions#0": 0.5}
    # The caller's own read timeout (0.2 s) is below the hint: the hint does not apply.
    with pytest.raises(httpx.ReadTimeout):
        client.get(URL, timeout=httpx.Timeout(5.0, read=0.2))
    assert hints_of(transport) == {"GET /v1/completions#0": 0.5}
    reads = [t["read"] for t in script.timeouts[1:]]
    assert reads == pytest.approx([0.3, 0.3, 0.3, 0.2, 0.2, 0.2])


def test_one_kind_the_sidecar_splits_in_two_gets_the_larger_hint() -> None:
    # The SDK's buckets and the sidecar's can disagree near a boundary (its policy may count
    # characters per token differently): then the shorter kind's hint must not cut the longer.
    time = FakeTime()
    short = {wire.TIMEOUT_HINT_MS: "400", wire.TIMEOUT_HINT_KEY: "/v1/completions#5"}
    longer = {wire.TIMEOUT_HINT_MS: "900", wire.TIMEOUT_HINT_KEY: "/v1/completions#6"}
    script = Script(ok(**longer), ok(**short), ok(), time=time)
    client, transport = make(script, time)
    client.post(URL, json=SHORT)
    client.post(URL, json=SHORT)
    client.post(URL, json=SHORT)
    assert hints_of(transport) == {"POST /v1/completions#5": 0.9}
    assert script.timeouts[-1]["read"] == 0.9


def test_concurrent_timeouts_at_the_same_hint_double_it_once() -> None:
    time = FakeTime()
    engine = Engine(RetryConfig(), clock=time.clock, rng=FixedRandom(0.5))
    first = httpx.Request("GET", URL)
    engine.after_attempt(engine.begin(first), httpx.Response(200, headers=HINT, request=first), None)
    requests = [httpx.Request("GET", URL) for _ in range(4)]
    calls = [engine.begin(r) for r in requests]
    for call, request in zip(calls, requests, strict=True):
        engine.before_attempt(call, request)
        assert call.hint_s == 0.5
    for call, request in zip(calls, requests, strict=True):
        engine.after_attempt(call, None, httpx.ReadTimeout("slow", request=request))
        assert call.signal is Signal.READ_TIMEOUT
    assert engine.statistics().hosts[HOST].timeout_hints == {"GET /v1/completions#0": 1.0}
