"""client_sdk.Client: call options as arguments and the one error tree."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from client_sdk import (
    Client,
    ConnectFailed,
    DeadlineExceeded,
    Overloaded,
    RampmeterClientError,
    Rejected,
    RetryBudgetExhausted,
    RetryConfig,
    ThrottledLocally,
    TimedOut,
    TransportFailed,
    wire,
)
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


def client(script: Script, time: FakeTime, **config: object) -> Client:
    return Client(
        "http://pod.test",
        config=RetryConfig(**config),
        transport=httpx.MockTransport(script),  # type: ignore[arg-type]
        clock=time.clock,
        sleep=time.sleep,
        rng=FixedRandom(0.5),
        wall_clock=lambda: 0.0,
    )


def test_success_returns_the_response_with_options_on_the_wire() -> None:
    time = FakeTime()
    script = Script(ok(), time=time)
    with client(script, time) as c:
        response = c.post(
            "/v1/chat",
            json={"x": 1},
            deadline_s=3.0,
            priority="interactive",
            cost_hint=40,
            tenant="t1",
            idempotency_key="k1",
        )
    assert response.json() == {"ok": True}
    sent = script.headers[0]
    assert [
        sent[h]
        for h in (
            wire.PRIORITY,
            wire.COST_HINT,
            wire.TENANT,
            wire.IDEMPOTENCY_KEY,
            wire.REQUEST_TIMEOUT_MS,
        )
    ] == ["interactive", "40", "t1", "k1", "3000"]


def test_overloaded_after_the_attempts_run_out() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.QUEUE_FULL, retry_after_ms=200), time=time)
    with pytest.raises(Overloaded) as caught:
        client(script, time).post("/v1/chat", json={})
    error = caught.value
    assert (error.reason, error.status, error.retry_after, error.attempts) == (
        "queue_full",
        503,
        0.2,
        3,
    )
    assert "sidecar: queue_full" in str(error)
    assert isinstance(error, Rejected) and isinstance(error, RampmeterClientError)


def test_tenant_quota_is_overloaded_with_429() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.TENANT_QUOTA, retry_after_ms=1000), time=time)
    with pytest.raises(Overloaded) as caught:
        client(script, time, max_attempts=1).get("/v1/models")
    assert (caught.value.status, caught.value.reason, caught.value.retry_after) == (
        429,
        "tenant_quota",
        1.0,
    )


def test_a_final_rejection_is_rejected_not_overloaded() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.IDEMPOTENCY_KEY_REUSED), time=time)
    with pytest.raises(Rejected) as caught:
        client(script, time).post("/v1/chat", json={})
    assert type(caught.value) is Rejected
    assert (caught.value.status, caught.value.reason, script.attempts) == (
        422,
        "idempotency_key_reused",
        1,
    )


def test_sidecar_deadline_expired_is_deadline_exceeded() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.DEADLINE_EXPIRED), time=time)
    with pytest.raises(DeadlineExceeded):
        client(script, time).get("/v1/models")
    assert script.attempts == 1


def test_no_time_to_retry_is_deadline_exceeded() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.QUEUE_FULL, retry_after_ms=2000), time=time)
    with pytest.raises(DeadlineExceeded) as caught:
        client(script, time).get("/v1/models", deadline_s=1.0)
    assert caught.value.attempts == 1


def test_budget_exhausted_on_a_rejection() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.GPU_PRESSURE), time=time)
    c = client(script, time, budget_max_tokens=1.0, budget_floor_per_s=0.0, budget_ratio=0.0)
    with pytest.raises(RetryBudgetExhausted) as caught:
        c.get("/v1/models")
    assert isinstance(caught.value.last, httpx.Response) and caught.value.attempts == 2


def test_throttled_locally() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.OVERLOADED), time=time)
    c = client(script, time, max_attempts=1, throttle_min_requests=2)
    for _ in range(2):
        with pytest.raises(Overloaded):
            c.get("/v1/models")
    with pytest.raises(ThrottledLocally) as caught:
        c.get("/v1/models")
    assert caught.value.last_reason == "overloaded"
    assert "throttled_locally" in str(caught.value) and "overloaded" in str(caught.value)
    assert c.statistics().throttled_locally == 1
    assert script.attempts == 2  # the refused call sent nothing


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        (fails(httpx.ConnectError), ConnectFailed),
        (fails(httpx.ConnectTimeout), ConnectFailed),
        (fails(httpx.PoolTimeout), TimedOut),
        (fails(httpx.ReadError), TransportFailed),
    ],
)
def test_httpx_errors_map_into_the_tree(outcome: Outcome, error: type[Exception]) -> None:
    time = FakeTime()
    script = Script(outcome, time=time)
    with pytest.raises(error) as caught:
        client(script, time).get("/v1/models")
    assert isinstance(caught.value.__cause__, httpx.TransportError)


def test_a_read_timeout_on_post_without_a_key_is_timed_out_after_one_attempt() -> None:
    time = FakeTime()
    script = Script(fails(httpx.ReadTimeout), ok(), time=time)
    with pytest.raises(TimedOut):
        client(script, time).post("/v1/chat", json={}, idempotency_key=False)
    assert script.attempts == 1


@pytest.mark.parametrize("code", [500, 404, 503])
def test_the_model_servers_own_errors_are_returned_as_httpx_would(code: int) -> None:
    time = FakeTime()
    script = Script(status(code), time=time)
    response = client(script, time).get("/v1/models")
    assert response.status_code == code


class _Chunks(httpx.SyncByteStream):
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def __iter__(self) -> Iterator[bytes]:
        yield b"data: one\n\n"
        if self.fail:
            raise httpx.ReadError("reset")
        yield b"data: two\n\n"


def test_stream_yields_the_body_and_maps_mid_stream_errors_without_retrying() -> None:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        return httpx.Response(200, stream=_Chunks(fail=len(seen) == 2))

    time = FakeTime()
    c = Client(
        "http://pod.test",
        transport=httpx.MockTransport(handler),
        clock=time.clock,
        sleep=time.sleep,
    )
    with c.stream("POST", "/v1/chat", json={}) as response:
        assert list(response.iter_lines()) == ["data: one", "", "data: two", ""]
    with pytest.raises(TransportFailed), c.stream("POST", "/v1/chat", json={}) as response:
        list(response.iter_bytes())
    assert len(seen) == 2


def test_stream_raises_the_tree_error_with_the_sidecars_message() -> None:
    time = FakeTime()
    script = Script(rejected(wire.Reason.DRAINING), time=time)
    with (
        pytest.raises(Overloaded) as caught,
        client(script, time, max_attempts=1).stream("GET", "/x"),
    ):
        pass
    assert "sidecar: draining" in str(caught.value)


def test_transport_kwargs_build_the_inner_transport() -> None:
    c = Client("http://pod.test", http2=False, limits=httpx.Limits(max_connections=7), timeout=3.0)
    assert isinstance(c.transport.inner, httpx.HTTPTransport)
    assert c.http.timeout == httpx.Timeout(3.0)
    assert "client_sdk.Client" in repr(c)
    c.close()
