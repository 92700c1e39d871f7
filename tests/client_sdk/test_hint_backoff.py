"""A stale timeout hint backs off instead of failing every attempt (found by bench/retry_storm).

The sidecar's `x-rampmeter-timeout-hint-ms` is 2.5 x its observed p99. When the
pod suddenly gets slower (a 3x slowdown), every attempt outlives the old hint,
so the SDK used to cut every attempt at it and never saw a response with a
newer one: with the sidecar in front, goodput fell to zero for seconds while
the call's deadline would have let the attempts finish. Now a read timeout that
the hint caused doubles the host's hint (as TCP backs off its retransmission
timer), and the next response's hint replaces it. All on fake time.
"""

from __future__ import annotations

import httpx
import pytest

from client_sdk import CallOptions, Engine, ResilientTransport, RetryConfig, wire
from client_sdk.signals import Signal
from tests.client_sdk.fakes import FakeTime, FixedRandom, Script, counting_keys, fails, ok

URL = "http://pod.test/v1/completions"
HOST = "http://pod.test:80"
HINT = {wire.TIMEOUT_HINT_MS: "500"}


def make(script: Script, time: FakeTime) -> tuple[httpx.Client, ResilientTransport]:
    transport = ResilientTransport(
        httpx.MockTransport(script),
        RetryConfig(max_attempts=3, backoff_base_s=0.0),
        clock=time.clock,
        sleep=time.sleep,  # type: ignore[arg-type]
        rng=FixedRandom(0.5),
        key_factory=counting_keys(),
    )
    return httpx.Client(transport=transport), transport


def hint_of(transport: ResilientTransport) -> float | None:
    return transport.statistics().hosts[HOST].timeout_hint_s


def test_a_read_timeout_at_the_hint_doubles_it_for_the_retry() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), ok(), time=time)
    client, transport = make(script, time)
    client.get(URL)  # learns the 0.5 s hint
    response = client.post(URL, json={}, extensions=CallOptions(deadline_s=5.0).extensions())
    assert response.status_code == 200
    assert [t.get("read") for t in script.timeouts[1:]] == [0.5, 1.0]
    assert hint_of(transport) == 1.0


def test_a_fresh_hint_from_the_server_replaces_the_backed_off_one() -> None:
    time = FakeTime()
    fresh = {wire.TIMEOUT_HINT_MS: "800"}
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), ok(**fresh), ok(), time=time)
    client, transport = make(script, time)
    client.get(URL)
    client.get(URL)  # times out at 0.5, retried at 1.0, answered with a hint of 0.8
    client.get(URL)
    assert hint_of(transport) == 0.8
    assert script.timeouts[-1]["read"] == 0.8


def test_no_back_off_when_the_deadline_or_the_callers_timeout_cut_the_attempt() -> None:
    time = FakeTime()
    script = Script(ok(**HINT), fails(httpx.ReadTimeout), time=time)
    client, transport = make(script, time)
    client.get(URL)
    # The deadline (0.3 s) is below the hint: the hint did not cut these attempts.
    with pytest.raises(httpx.ReadTimeout):
        client.get(URL, extensions=CallOptions(deadline_s=0.3).extensions())
    assert hint_of(transport) == 0.5
    # Nor here: the caller's own read timeout (0.2 s) is below the hint.
    with pytest.raises(httpx.ReadTimeout):
        client.get(URL, timeout=httpx.Timeout(5.0, read=0.2))
    assert hint_of(transport) == 0.5
    reads = [t["read"] for t in script.timeouts[1:]]
    assert reads == pytest.approx([0.3, 0.3, 0.3, 0.2, 0.2, 0.2])


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
    assert engine.statistics().hosts[HOST].timeout_hint_s == 1.0
