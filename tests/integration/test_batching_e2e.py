"""Micro-batching end to end: sim-pod (embeddings-serial: one call at a time) <- rampmeter serve <- httpx.

Real processes on 127.0.0.1. The same bodies go straight to the pod one by one and
through the sidecar all at once; the sidecar must answer each with the very bytes of
`embedding` values the pod gives that body alone, in fewer upstream calls.
Assertions are on bytes and counters, never on time.
"""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
import trio

from proxy.testing.procs import Proc, wait_for

pytestmark = pytest.mark.integration

POLICY = """
[warmup]
health_interval_s = 0.2
[slow_start]
window_s = 0.0
[gpu]
enabled = false
[limits]
kind = "fixed"
initial_limit = 64
min_limit = 1
[[routes]]
path_prefix = "/v1/embeddings"
kind = "embeddings"
base_ms = 20.0
ms_per_prompt_token = 0.02
ms_per_output_token = 0.0
[[batching.routes]]
path = "/v1/embeddings"
max_batch_items = 16
max_wait_ms = 30
length_buckets = [16]
"""


class _Item(msgspec.Struct):
    index: int
    embedding: msgspec.Raw


class _Answer(msgspec.Struct):
    data: list[_Item]


def raw_embeddings(body: bytes) -> list[bytes]:
    """The `embedding` values' bytes as the server wrote them, in index order."""
    return [bytes(d.embedding) for d in sorted(msgspec.json.decode(body, type=_Answer).data, key=lambda d: d.index)]


def bodies() -> list[bytes]:
    out = []
    for i in range(24):
        text = "word " * (1 + i * 7)  # 2 to 41 tokens: both length buckets
        value: str | list[str] = text if i % 3 else [text, f"second {i}"]
        doc = {"model": "sim-embeddings", "input": value}
        if i % 4 == 1:
            doc["encoding_format"] = "base64"  # what the OpenAI SDK asks for by default
        out.append(json.dumps(doc).encode())
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    path = tmp_path_factory.mktemp("batching") / "policy.toml"
    path.write_text(POLICY)
    with Proc(["sim-pod", "--listen", "127.0.0.1:0", "--profile", "embeddings-serial"], name="sim-pod") as pod:
        argv = ["serve", "--policy", str(path), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
        argv += ["--upstream", pod.url(), "--log-level", "warning"]
        with Proc(argv, name="sidecar") as sidecar:
            wait_for(lambda: _ready(sidecar), timeout_s=20)
            yield pod, sidecar


def _ready(proc: Proc) -> bool:
    try:
        return httpx.get(proc.url("admin") + "/readyz", timeout=2).is_success
    except httpx.HTTPError:
        return False


def metric(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def test_batched_answers_equal_unbatched_ones_byte_for_byte_in_fewer_calls(stack):
    pod, sidecar = stack
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as client:
        alone = []
        for body in bodies():
            resp = await client.post(pod.url() + "/v1/embeddings", content=body, headers=headers)
            assert resp.status_code == 200, resp.text
            alone.append(resp.content)
        (await client.post(pod.url() + "/sim/reset-stats")).raise_for_status()

        batched: dict[int, httpx.Response] = {}

        async def send(i: int, body: bytes) -> None:
            batched[i] = await client.post(sidecar.url() + "/v1/embeddings", content=body, headers=headers)

        async with trio.open_nursery() as nursery:
            for i, body in enumerate(bodies()):
                nursery.start_soon(send, i, body)

        for i, expected in enumerate(alone):
            resp = batched[i]
            assert resp.status_code == 200, resp.text
            assert raw_embeddings(resp.content) == raw_embeddings(expected)
            assert json.loads(resp.content)["usage"] == json.loads(expected)["usage"]
        calls = (await client.get(pod.url() + "/sim/stats")).json()["requests_completed"]
        text = (await client.get(sidecar.url("admin") + "/metrics")).text
    items = sum(len(json.loads(b)["input"]) if isinstance(json.loads(b)["input"], list) else 1 for b in bodies())
    assert metric(text, "rampmeter_batch_items_sum") == items
    assert calls == metric(text, "rampmeter_batches_total") < len(alone) / 2  # merged: at most half the calls
