"""The pod's HTTP handler driven directly (fake sink and body), on trio's autojump clock."""

from __future__ import annotations

import base64
import json
import struct

import pytest
import trio
import trio.lowlevel
import trio.testing

from proxy.http.messages import Request
from proxy.simpod.api import PodAPI
from proxy.simpod.driver import Pod
from proxy.simpod.profiles import Profile, get_profile
from proxy.simpod.workload import CHAT, oracle

# 10 ms steps, +1 ms per sequence, 0.1 ms per prompt token, 4 at once
P = Profile(model="m", base_ms=10.0, per_seq_ms=1.0, prefill_ms_per_token=0.1, max_num_seqs=4)


class FakeBody:
    def __init__(self, data: bytes) -> None:
        self.data, self.content_length = data, len(data)

    async def read_all(self) -> bytes:
        return self.data

    async def chunks(self):
        yield self.data


class FakeSink:
    def __init__(self) -> None:
        self.status, self.headers, self.body = None, None, b""
        self.events: list[tuple[float, bytes]] = []  # (time, data) of each send
        self.headers_sent = self.ended = False

    async def respond(self, status, headers, body=b""):
        assert not self.headers_sent
        self.status, self.headers, self.body, self.headers_sent, self.ended = status, headers, body, True, True

    async def start(self, status, headers):
        self.status, self.headers, self.headers_sent = status, headers, True

    async def send(self, data):
        self.events.append((trio.current_time(), data))
        self.body += data

    async def end(self):
        self.ended = True

    def json(self):
        return json.loads(self.body)

    def sse(self) -> list:
        frames = [f for f in self.body.decode().split("\n\n") if f]
        assert all(f.startswith("data: ") for f in frames)
        return [f[6:] if f == "data: [DONE]" else json.loads(f[6:]) for f in frames]


async def call(api: PodAPI, method: str, path: str, body=None, headers=()) -> FakeSink:
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    request = Request(
        method.encode(),
        path.encode(),
        [(k.encode(), v.encode()) for k, v in headers],
        FakeBody(raw),
        received_at=trio.current_time(),
    )
    sink = FakeSink()
    await api(request, sink)
    return sink


async def start(nursery, profile: Profile = P, **kw) -> PodAPI:
    pod = Pod(profile, **kw)
    await nursery.start(pod.run)
    return PodAPI(pod)


def chat(tokens: int, stream: bool = False, **extra) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 40}],
        "max_tokens": tokens,
        "stream": stream,
        **extra,
    }


async def stats(api: PodAPI) -> dict:
    return (await call(api, "GET", "/sim/stats")).json()


async def test_chat_completion_takes_the_oracle_time_and_reports_usage(nursery, autojump_clock) -> None:
    api = await start(nursery)
    t0 = trio.current_time()
    sink = await call(api, "POST", "/v1/chat/completions", chat(5))
    assert trio.current_time() - t0 == pytest.approx(oracle(CHAT, chat(5), P).service_s)
    doc = sink.json()
    assert sink.status == 200 and doc["object"] == "chat.completion"
    assert doc["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert doc["choices"][0]["finish_reason"] == "length" and doc["choices"][0]["message"]["content"]
    s = await stats(api)
    assert (s["requests_executed"], s["requests_completed"], s["output_tokens"], s["prompt_tokens"]) == (1, 1, 5, 10)
    assert s["busy_s"] == pytest.approx(s["useful_s"]) and s["wasted_s"] == 0.0


async def test_streaming_emits_one_event_per_token_as_each_step_ends(nursery, autojump_clock) -> None:
    api = await start(nursery)
    t0 = trio.current_time()
    sink = await call(api, "POST", "/v1/chat/completions", chat(4, stream=True, stream_options={"include_usage": True}))
    events = sink.sse()
    tokens, usage_event, done = events[:4], events[4], events[5]
    assert done == "[DONE]" and usage_event["choices"] == [] and usage_event["usage"]["completion_tokens"] == 4
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None, None, None, "length"]
    assert all(t["object"] == "chat.completion.chunk" for t in tokens)
    # one write per step, at the step's end: prefill step 12 ms (10+1+10*0.1), then 11 ms each
    times = [round((t - t0) * 1000, 6) for t, _ in sink.events[:4]]
    assert times == pytest.approx([12.0, 23.0, 34.0, 45.0])
    assert sink.ended and dict(sink.headers)[b"content-type"] == b"text/event-stream"


async def test_completions_stream_and_embeddings_shapes(nursery, autojump_clock) -> None:
    api = await start(nursery)
    sink = await call(api, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})
    events = sink.sse()
    assert [e["object"] for e in events[:2]] == ["text_completion"] * 2 and events[2] == "[DONE]"
    emb = (await call(api, "POST", "/v1/embeddings", {"input": ["a", "b"], "model": "e"})).json()
    assert [d["index"] for d in emb["data"]] == [0, 1] and len(emb["data"][0]["embedding"]) == P.embedding_dim
    again = (await call(api, "POST", "/v1/embeddings", {"input": "a", "encoding_format": "base64"})).json()
    floats = struct.unpack(f"<{P.embedding_dim}f", base64.b64decode(again["data"][0]["embedding"]))
    assert floats == pytest.approx(emb["data"][0]["embedding"], abs=1e-6)  # deterministic per text
    assert emb["usage"]["prompt_tokens"] == 2


async def test_batching_shares_steps_and_queues_past_max_num_seqs(nursery, autojump_clock) -> None:
    api = await start(nursery, Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0, max_num_seqs=2))
    done: list[float] = []

    async def one() -> None:
        await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 3})
        done.append(round(trio.current_time(), 6))

    t0 = trio.current_time()
    async with trio.open_nursery() as n:
        for _ in range(5):
            n.start_soon(one)
    # two at a time, 3 steps of 10 ms each: batches end at 30, 60, 90 ms
    assert [round(t - t0, 6) for t in done] == pytest.approx([0.03, 0.03, 0.06, 0.06, 0.09])
    s = await stats(api)
    assert (s["steps"], s["requests_executed"], s["running"], s["waiting"]) == (9, 5, 0, 0)


async def test_client_disconnect_frees_the_slot_and_counts_waste(nursery, autojump_clock) -> None:
    api = await start(nursery)
    sink = FakeSink()
    request = Request(b"POST", b"/v1/chat/completions", [], FakeBody(json.dumps(chat(100, True)).encode()))
    with trio.move_on_after(0.05):  # the server cancels the handler when the client goes
        await api(request, sink)
    assert 3 <= len(sink.events) < 100
    s = await stats(api)
    assert (s["running"], s["kv_reserved_tokens"], s["requests_cancelled_running"]) == (0, 0, 1)
    assert s["wasted_client_gone_s"] > 0 and s["wasted_s"] == pytest.approx(s["busy_s"])
    # a request still queued when its client goes never runs and wastes nothing
    api2 = await start(nursery, get_profile("llm", max_num_seqs=1, speed=100.0))
    async with trio.open_nursery() as n:
        n.start_soon(call, api2, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 50})
        await trio.testing.wait_all_tasks_blocked()  # let it submit first
        with trio.move_on_after(0.001):
            await call(api2, "POST", "/v1/completions", {"prompt": "y", "max_tokens": 50})
    s2 = await stats(api2)
    assert (s2["requests_cancelled_waiting"], s2["requests_executed"], s2["wasted_s"]) == (1, 1, 0.0)


async def test_deadline_header_and_idempotency_keys_are_accounted(nursery, autojump_clock) -> None:
    api = await start(nursery)
    await call(
        api,
        "POST",
        "/v1/completions",
        {"prompt": "x", "max_tokens": 10},
        headers=[("x-request-timeout-ms", "50"), ("idempotency-key", "k-1")],
    )
    await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}, headers=[("idempotency-key", "k-1")])
    s = await stats(api)
    assert s["requests_late"] == 1 and s["wasted_deadline_s"] > 0
    assert s["executions_by_idempotency_key"] == {"k-1": 2}
    bad = await call(api, "POST", "/v1/completions", {"prompt": "x"}, headers=[("x-request-timeout-ms", "soon")])
    assert bad.status == 400 and "x-request-timeout-ms" in bad.json()["error"]["message"]


async def test_cold_start_and_instance_identity(nursery, autojump_clock) -> None:
    api = await start(nursery, cold_start_s=5.0)
    health = await call(api, "GET", "/health")
    assert health.status == 503 and health.json()["status"] == "starting"
    assert (await call(api, "POST", "/v1/completions", {"prompt": "x"})).status == 503
    await trio.sleep(5.0)
    health = await call(api, "GET", "/health")
    doc = health.json()
    assert health.status == 200 and len(doc["instance_id"]) == 32 and doc["started_at"] > 0
    other = PodAPI(Pod(P))
    assert other.pod.instance_id != api.pod.instance_id
    assert (await stats(api))["not_ready"] == 1


async def test_cold_penalty_slows_the_first_requests(nursery, autojump_clock) -> None:
    flat = Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0)
    api = await start(nursery, flat, cold_penalty=4.0, cold_penalty_requests=2)
    durations = []
    for _ in range(3):
        t0 = trio.current_time()
        await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        durations.append(round(trio.current_time() - t0, 6))
    assert durations == pytest.approx([0.04, 0.025, 0.01])


async def test_runtime_faults_slow_steps_and_inject_errors_for_a_window(nursery, autojump_clock) -> None:
    flat = Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0)
    api = await start(nursery, flat)
    r = await call(api, "POST", "/sim/faults", {"slowdown": 3.0, "duration_s": 1.0})
    assert r.status == 200 and r.json()["slowdown"] == 3.0
    t0 = trio.current_time()
    await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert trio.current_time() - t0 == pytest.approx(0.06)
    await trio.sleep(1.0)  # the window is over
    t0 = trio.current_time()
    await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert trio.current_time() - t0 == pytest.approx(0.02)
    await call(api, "POST", "/sim/faults", {"error_rate": 1.0})
    err = await call(api, "POST", "/v1/completions", {"prompt": "x"})
    assert err.status == 500 and err.json()["error"]["type"] == "internal_server_error"
    await call(api, "POST", "/sim/faults", {})
    assert (await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})).status == 200
    s = await stats(api)
    assert (s["injected_errors"], s["requests_executed"]) == (1, 3)
    assert (await call(api, "POST", "/sim/faults", {"slowdown": -1})).status == 400


async def test_cli_fault_window_is_relative_to_start(nursery, autojump_clock) -> None:
    from proxy.simpod.faults import Fault, Faults

    flat = Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0)
    api = await start(nursery, flat, faults=Faults([Fault(2.0, 0.0, 1.0, 2.0)]))
    spans = []
    for wait in (0.0, 1.0, 1.0):
        await trio.sleep(wait)
        t0 = trio.current_time()
        await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        spans.append(round(trio.current_time() - t0, 6))
    assert spans == pytest.approx([0.01, 0.02, 0.01])


async def test_errors_models_metrics_and_reset(nursery, autojump_clock) -> None:
    api = await start(nursery)
    bad = await call(api, "POST", "/v1/chat/completions", b"{oops")
    assert bad.status == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    missing = await call(api, "POST", "/v1/chat/completions", {"model": "m"})
    assert missing.status == 400 and missing.json()["error"]["param"] == "messages"
    assert (await call(api, "GET", "/nope")).status == 404
    assert (await call(api, "GET", "/v1/chat/completions")).status == 405
    models = (await call(api, "GET", "/v1/models")).json()
    assert models["data"][0]["id"] == "m"
    await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 3})
    text = (await call(api, "GET", "/metrics")).body.decode()
    for line in (
        'vllm:num_requests_running{model_name="m"} 0.0',
        'vllm:num_requests_waiting{model_name="m"} 0.0',
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.0',
        'vllm:generation_tokens_total{model_name="m"} 3.0',
    ):
        assert line in text
    s = await stats(api)
    assert (s["bad_requests"], s["not_found"], s["requests_completed"]) == (2, 2, 1)
    assert (await call(api, "POST", "/sim/reset-stats")).status == 200
    s = await stats(api)
    assert (s["bad_requests"], s["requests_completed"], s["busy_s"], s["http_requests"]) == (0, 0, 0.0, 1)


async def test_metrics_show_saturation_while_busy(nursery, autojump_clock) -> None:
    api = await start(nursery, Profile(model="m", max_num_seqs=2, kv_capacity_tokens=1000))
    async with trio.open_nursery() as n:
        for _ in range(3):
            n.start_soon(call, api, "POST", "/v1/completions", {"prompt": "x" * 40, "max_tokens": 90})
        await trio.sleep(0.05)
        text = (await call(api, "GET", "/metrics")).body.decode()
        assert 'vllm:num_requests_running{model_name="m"} 2.0' in text
        assert 'vllm:num_requests_waiting{model_name="m"} 1.0' in text
        assert 'vllm:gpu_cache_usage_perc{model_name="m"} 0.2' in text  # 2 * (10 + 90) / 1000


async def test_idle_pod_does_not_step(nursery, autojump_clock) -> None:
    api = await start(nursery)
    await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    await trio.testing.wait_all_tasks_blocked()
    steps = api.pod.engine.statistics().steps
    await trio.sleep(3600)
    assert api.pod.engine.statistics().steps == steps == 2


# --- real servers' habits (issue 12) ---


async def test_a_profile_without_health_or_v1_serves_the_bare_paths_and_404s_the_rest(nursery, autojump_clock) -> None:
    api = await start(nursery, P.with_overrides(health_path="", api_prefix=""))
    assert (await call(api, "GET", "/health")).status == 404
    assert (await call(api, "POST", "/v1/chat/completions", chat(2))).status == 404
    ok = await call(api, "POST", "/chat/completions", chat(2))
    assert ok.status == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert (await call(api, "POST", "/embeddings", {"input": "a"})).json()["object"] == "list"
    assert (await call(api, "GET", "/models")).json()["data"][0]["id"] == "m"
    assert (await call(api, "GET", "/metrics")).status == 200  # the pod's own controls stay
    moved = await start(nursery, P.with_overrides(health_path="/healthz"))
    assert (await call(moved, "GET", "/healthz")).status == 200
    assert (await call(moved, "GET", "/health")).status == 404


async def test_a_pod_that_keeps_computing_finishes_the_work_its_client_left(nursery, autojump_clock) -> None:
    api = await start(nursery, P.with_overrides(stops_on_cancel=False, max_num_seqs=1))
    t0 = trio.current_time()
    with trio.move_on_after(0.02):  # the client goes after 20 ms of a ~0.12 s request
        await call(api, "POST", "/v1/chat/completions", chat(10))
    s = await stats(api)
    assert (s["running"], s["requests_orphaned"], s["requests_cancelled"]) == (1, 1, 0)
    assert s["idle_for_s"] == 0.0
    # the next request waits for the orphan: cancelling freed nothing
    await call(api, "POST", "/v1/chat/completions", chat(1))
    alone = oracle(CHAT, chat(10), P).service_s
    assert trio.current_time() - t0 >= alone
    s = await stats(api)
    assert s["orphans"] == 0 and s["wasted_client_gone_s"] == pytest.approx(alone, rel=0.2)
    await trio.sleep(1.0)
    assert (await stats(api))["idle_for_s"] == pytest.approx(1.0)


async def test_a_padded_batch_answers_a_short_request_with_the_longest(nursery, autojump_clock) -> None:
    api = await start(nursery, P.with_overrides(batching="padded", prefill_ms_per_token=0.0, per_seq_ms=0.0))
    done: dict[int, float] = {}

    async def one(tokens: int) -> None:
        await call(api, "POST", "/v1/completions", {"prompt": "x", "max_tokens": tokens})
        done[tokens] = trio.current_time()

    t0 = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(one, 1)
        n.start_soon(one, 8)
    assert done[1] == done[8] and done[8] - t0 == pytest.approx(0.08)
