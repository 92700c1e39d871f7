"""Micro-batching on the request path, in virtual time: the real App, RequestPath and Batcher in front of
the simulated pod's unbatched embeddings profile, served in-process (tests/runtime/test_request_path_deadlines.py's
PodPool), so every time below is exact under the autojump clock and a cancelled call cancels the pod's work.

The pod's embeddings-serial profile runs one call at a time: 20 ms a call plus 0.02 ms a token of its
inputs; the route's service-time prior says the same, so the batcher's latency curve starts right.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import pytest
import trio
import trio.testing

from proxy.app import App
from proxy.core.batching import DEADLINE_SAFETY
from proxy.errors import UpstreamConnectError
from proxy.http.messages import Request, ResponseSink
from proxy.policy.load import policy_from_builtins
from proxy.policy.schema import Policy
from proxy.simpod import get_profile
from proxy.simpod.api import PodAPI
from proxy.simpod.driver import Pod
from tests.runtime.test_request_path_deadlines import VERSION, PodPool, _Ready, start

EMBED = "/v1/embeddings"
CALL_S = 0.020  # the profile's cost of one call, before tokens
PER_TOKEN_S = 0.00002


def policy(*, limit: int = 64, stops_on_cancel: bool | str = "auto", **route) -> Policy:
    data = msgspec.to_builtins(Policy())
    data["upstreams"] = [{"url": "http://pod.inproc:80", "stops_on_cancel": stops_on_cancel}]
    data["limits"].update(kind="fixed", initial_limit=limit, min_limit=1, max_limit=max(limit, 256))
    data["slow_start"]["window_s"] = 0.0
    data["gpu"]["enabled"] = False
    data["scheduling"]["unjudged_in_flight"] = 0  # the priors below are the pod's own figures
    for r in data["routes"]:
        if r["path_prefix"] == EMBED:
            r.update(base_ms=CALL_S * 1000, ms_per_prompt_token=PER_TOKEN_S * 1000)
    data["batching"]["routes"] = [{"path": EMBED, "max_wait_ms": 5.0, "length_buckets": []} | route]
    return policy_from_builtins(data, "test")


def embed(*inputs: str, model: str = "sim-embeddings", **extra) -> bytes:
    value: str | list[str] = inputs[0] if len(inputs) == 1 else list(inputs)
    return json.dumps({"model": model, "input": value, **extra}).encode()


@dataclass
class Stack:
    app: App
    pod: Pod
    pool: PodPool
    nursery: trio.Nursery
    api: PodAPI

    def call(self, body: bytes, *headers: tuple[str, str], path: str = EMBED):
        hdrs = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in headers)]
        return start(self.nursery, self.app.request_path, path, body, hdrs)

    async def alone(self, body: bytes) -> bytes:
        """What the pod answers this body sent straight to it, by itself."""
        status, answer = await start(
            self.nursery, self.api, EMBED, body, [(b"content-type", b"application/json")]
        ).answer()
        assert status == 200
        return answer

    def bodies_sent(self) -> list[dict]:
        return [json.loads(b) for b in self.pool.bodies]

    def inflight(self) -> int:
        return self.app.scheduler.statistics()["inflight_requests"]

    def metric(self, name: str, **labels: str) -> float:
        value = self.app.metrics.registry.get_sample_value("rampmeter_" + name, labels)
        return 0.0 if value is None else value


class Ready(_Ready):
    def update_policy(self, policy) -> None:
        pass


async def staggered(s: Stack, bodies: list[bytes], gap_s: float = 0.0001) -> list:
    """Calls that arrive in this order (tasks started at one instant run in any order)."""
    pipes = []
    for body in bodies:
        pipes.append(s.call(body))
        await trio.sleep(gap_s)
    return pipes


class RecordingPool(PodPool):
    """PodPool that also keeps each request body the upstream received."""

    def __init__(self, handler, nursery) -> None:
        super().__init__(handler, nursery)
        self.bodies: list[bytes] = []

    @contextlib.asynccontextmanager
    async def request(self, upstream, method, target, headers, body):
        self.bodies.append(bytes(body))
        async with super().request(upstream, method, target, headers, body) as resp:
            yield resp


@contextlib.asynccontextmanager
async def stack(pol: Policy, *, handler=None, **profile) -> AsyncIterator[Stack]:
    async with trio.open_nursery() as nursery:
        pod = Pod(get_profile("embeddings-serial", **profile))
        await nursery.start(pod.run)
        api = PodAPI(pod)
        pool = RecordingPool(handler or api, nursery)
        app = App(pol, VERSION, rng=random.Random(0), pool=pool, lifecycles=Ready())
        app.nursery = app.request_path.nursery = nursery
        await nursery.start(app.batcher.run)
        yield Stack(app, pod, pool, nursery, api)
        nursery.cancel_scope.cancel()


class _Item(msgspec.Struct):
    index: int
    embedding: msgspec.Raw


class _Embeddings(msgspec.Struct):
    data: list[_Item]


def raw_embeddings(body: bytes) -> list[bytes]:
    return [bytes(d.embedding) for d in sorted(msgspec.json.decode(body, type=_Embeddings).data, key=lambda d: d.index)]


# --- sharing a call -------------------------------------------------------------


async def test_concurrent_requests_share_one_call_and_each_gets_what_it_alone_gets(autojump_clock):
    async with stack(policy()) as s:
        bodies = [embed(f"text number {i}" * (i + 1)) for i in range(6)] + [embed("a", "list of", "three")]
        t0 = trio.current_time()
        pipes = [s.call(b) for b in bodies]
        answers = [await p.answer() for p in pipes]
        sent = s.bodies_sent()
        assert len(sent) == 1 and len(sent[0]["input"]) == 9  # one upstream call for all nine inputs
        tokens = s.pod.engine.statistics().prompt_tokens
        assert all(p.answered_at == pytest.approx(t0 + 0.005 + CALL_S + PER_TOKEN_S * tokens) for p in pipes)
        for body, (status, answer) in zip(bodies, answers, strict=True):
            alone = await s.alone(body)
            assert status == 200
            assert raw_embeddings(answer) == raw_embeddings(alone)  # byte for byte
            assert json.loads(answer) == json.loads(alone)  # usage included
        assert s.metric("batches_total", route=EMBED, closed_by="time") == 1
        assert s.metric("batch_items_sum", route=EMBED) == 9
        assert s.inflight() == 0


async def test_a_full_batch_leaves_at_once_and_the_next_gathers_while_the_call_runs(autojump_clock):
    async with stack(policy(max_batch_items=4, max_wait_ms=50)) as s:
        t0 = trio.current_time()
        pipes = [s.call(embed(f"x{i}")) for i in range(6)]
        for p in pipes:
            assert (await p.answer())[0] == 200
        first, second = s.bodies_sent()
        assert (len(first["input"]), len(second["input"])) == (4, 2)
        assert min(p.answered_at for p in pipes) < t0 + 0.050  # closed by size, not by the window
        assert s.metric("batches_total", route=EMBED, closed_by="size") == 1


async def test_different_models_parameters_and_credentials_never_share_a_call(autojump_clock):
    async with stack(policy()) as s:
        pipes = [
            s.call(embed("a")),
            s.call(embed("b")),
            s.call(embed("c", model="other")),
            s.call(embed("d", dimensions=4)),
            s.call(embed("e"), ("authorization", "Bearer team-b")),
        ]
        for p in pipes:
            await p.answer()
        inputs = sorted(
            tuple(sorted(b["input"])) if isinstance(b["input"], list) else (b["input"],) for b in s.bodies_sent()
        )
        assert inputs == [("a", "b"), ("c",), ("d",), ("e",)]


async def test_bodies_that_cannot_be_taken_apart_and_other_paths_go_alone_unchanged(autojump_clock):
    async with stack(policy()) as s:
        status, _ = await s.call(b"not json").answer()
        assert status == 400  # the pod's own answer to the body as sent
        assert s.pool.bodies == [b"not json"]
        assert s.metric("batch_unbatched_total", route=EMBED, reason="not_json_object") == 1
        big = embed(*["w"] * 40)  # more inputs than max_batch_items (32)
        assert (await s.call(big).answer())[0] == 200
        assert s.pool.bodies[-1] == big
        assert s.metric("batch_unbatched_total", route=EMBED, reason="too_large") == 1


# --- admission stays one system ---------------------------------------------------


async def test_a_gathering_batch_holds_each_members_admission_slot(autojump_clock):
    async with stack(policy(limit=2, max_wait_ms=10)) as s:
        t0 = trio.current_time()
        pipes = await staggered(s, [embed(f"x{i}") for i in range(3)])
        await trio.sleep(0.005)
        assert s.inflight() == 2  # two gather holding their slots; the third waits for admission
        assert s.app.scheduler.statistics()["queued"] == 1
        for p in pipes:
            assert (await p.answer())[0] == 200
        first, second = s.bodies_sent()
        assert (len(first["input"]), second["input"]) == (2, "x2")
        assert pipes[2].answered_at > t0 + 0.010 + CALL_S  # admitted when the first batch released its slots
        assert s.inflight() == 0


# --- clients that leave -------------------------------------------------------------


async def test_a_member_whose_client_leaves_before_the_send_is_taken_out(autojump_clock):
    async with stack(policy(max_wait_ms=50)) as s:
        pipes = await staggered(s, [embed(f"x{i}") for i in range(3)])
        await trio.sleep(0.010)
        await pipes[1].aclose()
        for p in (pipes[0], pipes[2]):
            assert (await p.answer())[0] == 200
        (sent,) = s.bodies_sent()
        assert sent["input"] == ["x0", "x2"]
        assert s.metric("batch_members_dropped_total", route=EMBED, stage="gathering") == 1
        assert s.inflight() == 0


async def test_a_member_leaving_a_sent_batch_has_its_share_discarded_and_the_others_are_answered(autojump_clock):
    async with stack(policy(max_batch_items=3)) as s:
        pipes = [s.call(embed(f"x{i}")) for i in range(3)]
        await trio.sleep(0.005)  # sent at once (full), now upstream
        assert len(s.pool.bodies) == 1
        await pipes[0].aclose()
        for p in pipes[1:]:
            assert (await p.answer())[0] == 200
        assert s.metric("batch_members_dropped_total", route=EMBED, stage="sent") == 1
        assert s.pod.engine.statistics().requests_completed == 1
        assert s.inflight() == 0


async def test_when_every_member_of_a_sent_batch_leaves_the_upstream_call_is_cancelled(autojump_clock):
    # The pod stops on cancel and the policy says so: no phantom lease outlives the cancelled call.
    async with stack(policy(max_batch_items=2, stops_on_cancel=True), stops_on_cancel=True) as s:
        pipes = [s.call(embed("long " * 400)), s.call(embed("long " * 400))]
        await trio.sleep(0.005)
        for p in pipes:
            await p.aclose()
        await trio.sleep(0.1)
        stats = s.pod.engine.statistics()
        assert (stats.requests_cancelled_running, stats.requests_completed) == (1, 0)
        assert s.inflight() == 0


# --- deadlines ------------------------------------------------------------------------


async def test_a_member_whose_deadline_cannot_absorb_the_window_leaves_at_its_latest_departure(autojump_clock):
    async with stack(policy(max_wait_ms=200)) as s:
        t0 = trio.current_time()
        patient = s.call(embed("patient"))
        hurried = s.call(embed("hurry"), ("x-request-timeout-ms", "100"))
        status, _ = await hurried.answer()
        assert status == 200 and hurried.answered_at <= t0 + 0.100
        # Both went at the latest departure: 100 ms - 1.5 x the expected 20.08 ms of the call.
        (sent,) = s.bodies_sent()
        assert sorted(sent["input"]) == ["hurry", "patient"]
        call_s = CALL_S + 4 * PER_TOKEN_S
        assert hurried.answered_at == pytest.approx(t0 + 0.100 - DEADLINE_SAFETY * call_s + call_s)
        assert (await patient.answer())[0] == 200
        assert s.metric("batches_total", route=EMBED, closed_by="deadline") == 1


# --- errors ------------------------------------------------------------------------------


TOO_LONG = "w" * 4000  # 1000 tokens: above the pod's max_model_len (512), so the pod answers 400


@pytest.mark.parametrize("on_error", ["fail_all", "split"])
async def test_a_bad_input_fails_its_batch_or_only_its_half(autojump_clock, on_error):
    async with stack(policy(on_batch_error=on_error)) as s:
        pipes = await staggered(s, [embed("ok0"), embed(TOO_LONG), embed("ok2"), embed("ok3")])
        statuses = [(await p.answer())[0] for p in pipes]
        if on_error == "fail_all":
            assert statuses == [400, 400, 400, 400] and len(s.pool.bodies) == 1
        else:
            assert statuses == [400, 400, 200, 200] and len(s.pool.bodies) == 3
            assert s.metric("batch_retries_total", route=EMBED, kind="split") == 1
        assert s.inflight() == 0


async def naming_server(request: Request, sink: ResponseSink) -> None:
    """An embeddings server that refuses a call naming the first input equal to "BAD"."""
    doc = json.loads(await request.body.read_all())
    inputs = doc["input"] if isinstance(doc["input"], list) else [doc["input"]]
    if "BAD" in inputs:
        k = inputs.index("BAD")
        err = {
            "error": {"message": f"input[{k}] is not allowed", "type": "invalid_request_error", "param": f"input[{k}]"}
        }
        await sink.respond(400, [(b"content-type", b"application/json")], json.dumps(err).encode())
        return
    data = [{"object": "embedding", "index": i, "embedding": [len(x), 0.5]} for i, x in enumerate(inputs)]
    await sink.respond(
        200, [(b"content-type", b"application/json")], json.dumps({"object": "list", "data": data}).encode()
    )


async def test_an_error_naming_one_input_fails_only_its_member(autojump_clock):
    async with stack(policy(), handler=naming_server) as s:
        pipes = await staggered(s, [embed("a"), embed("bb", "BAD"), embed("ccc")])
        results = [await p.answer() for p in pipes]
        assert [r[0] for r in results] == [200, 400, 200]
        assert json.loads(results[1][1])["error"]["param"] == "input[1]"  # renumbered: its own second input
        assert json.loads(results[2][1])["data"][0]["embedding"] == [3, 0.5]
        assert len(s.pool.bodies) == 2  # the call, then the others once more
        assert s.metric("batch_retries_total", route=EMBED, kind="blamed") == 1


class RefusingPool:
    def authority(self, upstream: int) -> bytes:
        return b"down"

    def request(self, *args):
        raise UpstreamConnectError("connection refused")


async def test_a_connection_failure_gives_every_member_502(autojump_clock):
    async with stack(policy()) as s:
        s.app.pool = RefusingPool()
        s.app.request_path.update(s.app.collaborators())  # the request path's parts, with that pool
        pipes = [s.call(embed("a")), s.call(embed("b"))]
        for p in pipes:
            status, _ = await p.answer()
            assert (status, p.header("x-rampmeter-reason")) == (502, "upstream_unavailable")
        assert s.inflight() == 0


async def test_a_reload_takes_new_bounds_and_removing_the_route_stops_batching(autojump_clock):
    async with stack(policy(max_wait_ms=50)) as s:
        s.app.apply_policy(policy(max_wait_ms=1), VERSION)
        t0 = trio.current_time()
        pipe = s.call(embed("a"))
        await pipe.answer()
        assert pipe.answered_at == pytest.approx(t0 + 0.001 + CALL_S + PER_TOKEN_S)
        data = msgspec.to_builtins(s.app.policy)
        data["batching"]["routes"] = []
        s.app.apply_policy(policy_from_builtins(data, "test"), VERSION)
        body = embed("b")
        assert (await s.call(body).answer())[0] == 200
        assert s.pool.bodies[-1] == body  # forwarded as it came


async def rerank_server(request: Request, sink: ResponseSink) -> None:
    """A rerank server: one query, scores by document length, results best first, top_n honoured."""
    doc = json.loads(await request.body.read_all())
    ranked = sorted(range(len(doc["documents"])), key=lambda i: (-len(doc["documents"][i]), i))
    if doc.get("top_n") is not None:
        ranked = ranked[: doc["top_n"]]
    results = [{"index": i, "relevance_score": len(doc["documents"][i]) / 100} for i in ranked]
    body = json.dumps({"model": "r", "results": results}).encode()
    await sink.respond(200, [(b"content-type", b"application/json")], body)


async def test_rerank_requests_with_one_query_share_a_call_and_keep_their_own_top_n(autojump_clock):
    pol = policy()
    data = msgspec.to_builtins(pol)
    data["batching"]["routes"] = [{"path": "/v1/rerank", "kind": "rerank", "max_wait_ms": 5.0}]
    async with stack(policy_from_builtins(data, "test"), handler=rerank_server) as s:
        bodies = [
            json.dumps({"model": "r", "query": "q", "documents": ["a", "bbb"], "top_n": 1}).encode(),
            json.dumps({"model": "r", "query": "q", "documents": ["cc", "d", "eeee"]}).encode(),
            json.dumps({"model": "r", "query": "other", "documents": ["x"]}).encode(),
        ]
        pipes = [s.call(b, path="/v1/rerank") for b in bodies]
        answers = [json.loads((await p.answer())[1]) for p in pipes]
        assert len(s.pool.bodies) == 2  # the two "q" requests merged; "other" alone
        assert answers[0]["results"] == [{"index": 1, "relevance_score": 0.03}]
        assert [r["index"] for r in answers[1]["results"]] == [2, 0, 1]
        assert answers[2]["results"] == [{"index": 0, "relevance_score": 0.01}]
