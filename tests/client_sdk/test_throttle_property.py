"""Properties of the adaptive throttle as the SDK runs it, for any sequence of answers.

Through the real ResilientTransport on fake time, with a coin that always lands on
"refuse" whenever the refusal probability is above zero (the most hostile draw):

- for any sequence of sidecar answers (every reason, with and without Retry-After, the
  model server's own statuses, transport errors), no call is refused while fewer than
  `throttle_min_requests` attempts are in the window;
- a healthy pod (every answer 2xx, with or without timeout hints) is never throttled.

Issue 14: one refused call used to lock the client out, because refusals counted as
requests, one sample was enough to act on, and client-caused rejections counted as
overload.
"""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_sdk import ResilientTransport, RetryConfig, wire
from tests.client_sdk.fakes import FakeTime, FixedRandom, Outcome, rejected

HOST = "http://pod.test:80"
URL = "http://pod.test/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

_rejections = st.builds(
    rejected,
    st.sampled_from(list(wire.Reason)),
    st.one_of(st.none(), st.integers(0, 5000)),
)
_plain = st.sampled_from(
    [
        Outcome(200),
        Outcome(200, {wire.TIMEOUT_HINT_MS: "300", wire.TIMEOUT_HINT_KEY: "/v1/chat/completions#4"}),
        Outcome(404),
        Outcome(500),
        Outcome(502),
        Outcome(503),
        Outcome(429),
        Outcome(raises=httpx.ConnectError),
        Outcome(raises=httpx.ReadTimeout),
        Outcome(raises=httpx.ReadError),
        Outcome(raises=httpx.PoolTimeout),
    ]
)
answers = st.one_of(_rejections, _plain)
healthy = st.sampled_from(
    [
        Outcome(200),
        Outcome(201),
        Outcome(204),
        Outcome(200, {wire.TIMEOUT_HINT_MS: "150", wire.TIMEOUT_HINT_KEY: "/v1/chat/completions#4"}),
        Outcome(200, {wire.TIMEOUT_HINT_MS: "9000", wire.TIMEOUT_HINT_KEY: "/v1/chat/completions#4"}),
    ]
)


class Pod:
    """Answers each attempt with the next scripted outcome (the last one repeats)."""

    def __init__(self, outcomes: list[Outcome], time: FakeTime) -> None:
        self.outcomes, self.time, self.i = outcomes, time, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        outcome = self.outcomes[min(self.i, len(self.outcomes) - 1)]
        self.i += 1
        self.time.now += 0.05
        return outcome.respond(request)


def drive(outcomes: list[Outcome], gaps: list[float], config: RetryConfig) -> list[tuple[int, bool]]:
    """Run one call per gap; returns (requests in the window before the call, refused?) per call."""
    time = FakeTime()
    transport = ResilientTransport(
        httpx.MockTransport(Pod(outcomes, time)),
        config,
        clock=time.clock,
        sleep=time.sleep,  # type: ignore[arg-type]
        rng=FixedRandom(0.0),  # refuse whenever p > 0
    )
    seen = []
    with httpx.Client(transport=transport) as client:
        for gap in gaps:
            time.now += gap
            stats = transport.statistics()
            before = stats.hosts[HOST].window_requests if HOST in stats.hosts else 0
            refused_before = stats.throttled_locally
            try:
                client.post(URL, json=BODY)
            except httpx.HTTPError:
                pass  # transport errors the SDK gave up on: the property is about refusals
            seen.append((before, transport.statistics().throttled_locally > refused_before))
    return seen


# No deadline, and no "input generation is slow" check: the machines are shared and busy.
SHARED_MACHINE = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


@settings(max_examples=150, **SHARED_MACHINE)
@given(
    outcomes=st.lists(answers, min_size=1, max_size=80),
    gaps=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=60),
    min_requests=st.integers(1, 30),
)
def test_never_refuses_while_the_window_holds_fewer_than_the_minimum(
    outcomes: list[Outcome], gaps: list[float], min_requests: int
) -> None:
    config = RetryConfig(throttle_min_requests=min_requests, throttle_window_s=10.0)
    for before, refused in drive(outcomes, gaps, config):
        if before < min_requests:
            assert not refused


@settings(max_examples=100, **SHARED_MACHINE)
@given(
    outcomes=st.lists(healthy, min_size=1, max_size=80),
    gaps=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=80),
    min_requests=st.integers(0, 30),
)
def test_a_healthy_pod_is_never_throttled(outcomes: list[Outcome], gaps: list[float], min_requests: int) -> None:
    config = RetryConfig(throttle_min_requests=min_requests, throttle_window_s=10.0)
    assert not any(refused for _, refused in drive(outcomes, gaps, config))
