"""Health checks and warm-up probes against one upstream, over httpx.

Theory of operation: these requests go straight to the model server on their own
httpx connection pool, not through the sidecar's data-path pool: they must work
while the data path rejects everything as not ready, and they must not count in
its limits or metrics. httpx is the project's probe client (it runs under trio
through anyio); the client is built with `timeout=None` and `trust_env=False`,
so the only deadlines are the trio cancel scopes set here and by the caller
(one absolute deadline flows down), and no HTTP_PROXY in a pod's environment
ever diverts a probe.

- `check_health`: one health round (`proxy.core.health.HealthDiscovery`): a GET
  of the configured health path, or of the discovered one, or of each candidate
  in turn until one says anything; healthy on a 2xx. If the answer is a JSON
  object, the values of the policy's identity keys (instance_id, started_at)
  identify the process, so a restart between two checks is noticed. The whole
  round is bounded by `health_timeout_ms` (each GET gets what is left).
  With `health_check = "grpc"` the round is one grpc.health.v1 Check instead
  (`proxy.runtime.grpc_health`); `health_port` sends either to another port of
  the upstream's host (Triton: HTTP health on 8000 beside gRPC on 8001).
- `run_probes`: drives a `proxy.core.warmup.ProbePlan` with `concurrency`
  workers until its verdict is in; each probe gets its own deadline
  (`probe_timeout_ms`) inside whatever deadline the caller set for the whole
  warm-up. Results are reported to `on_result` as they complete (metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import msgspec
import trio

from proxy.core.health import Answer, HealthDiscovery, Tried, answer_of
from proxy.core.warmup import FixedCount, ProbePlan, ProbeResult, StableLatency, Verdict
from proxy.policy.warmup import Probe, Warmup
from proxy.runtime import grpc_health

# Health answers are tiny; a huge one is not worth decoding for an identity.
MAX_IDENTITY_BODY = 65_536


@dataclass(frozen=True)
class HealthResult:
    ok: bool
    identity: tuple[str, ...] | None
    detail: str  # what was tried and answered, for /readyz


def new_client(max_connections: int, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=None,
        trust_env=False,
        transport=transport,
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    )


async def check_health(
    client: httpx.AsyncClient, base_url: str, warmup: Warmup, discovery: HealthDiscovery
) -> HealthResult:
    """One health round, bounded by `warmup.health_timeout_ms` within the caller's deadline."""
    base_url = health_base(base_url, warmup.health_port)
    if warmup.health_check == "grpc":
        return await _grpc_health(base_url, warmup)
    tried: list[Tried] = []
    identity = None
    paths = discovery.paths()
    with trio.move_on_after(warmup.health_timeout_ms / 1000) as round_scope:
        for path in paths:
            answer, identity = await _health_get(client, base_url + path, warmup)
            tried.append(Tried(path, *answer))
            if not discovery.keep_going(tried[-1]):
                break
    if round_scope.cancelled_caught:  # the GET in flight got no answer in time
        tried.append(Tried(paths[len(tried)], "timeout", Answer.DOWN))
    ok = discovery.conclude(tried)
    return HealthResult(ok, identity, discovery.describe())


def health_base(base_url: str, port: int) -> str:
    """The upstream's URL with the health check's own port (warmup.health_port; 0 keeps it)."""
    if not port:
        return base_url
    url = httpx.URL(base_url)
    return str(url.copy_with(port=port)).rstrip("/")


async def _grpc_health(base_url: str, warmup: Warmup) -> HealthResult:
    url = httpx.URL(base_url)
    with trio.move_on_after(warmup.health_timeout_ms / 1000):
        ok, detail = await grpc_health.check(url.host, url.port or 80, warmup.grpc_health_service)
        return HealthResult(ok, None, detail)
    return HealthResult(False, None, f"grpc health: no answer within {warmup.health_timeout_ms} ms")


async def _health_get(client: httpx.AsyncClient, url: str, warmup: Warmup):
    """((detail, answer), identity) of one GET; a timeout is the caller's cancel scope."""
    try:
        response = await client.get(url)
    except httpx.HTTPError as exc:
        return (_error(exc), Answer.DOWN), None
    identity = identity_of(response.content, warmup.identity_keys)  # also from a 503 "loading"
    return (str(response.status_code), answer_of(response.status_code)), identity


def identity_of(body: bytes, keys: Sequence[str]) -> tuple[str, ...] | None:
    """`key=value` for each identity key present in a JSON object body; None if none is."""
    if not keys or not body or len(body) > MAX_IDENTITY_BODY or not body.lstrip().startswith(b"{"):
        return None
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):  # a server's answer is input too
        return None
    if not isinstance(data, dict):
        return None
    found = tuple(f"{k}={data[k]}" for k in keys if k in data)
    return found or None


def plan_for(warmup: Warmup) -> ProbePlan:
    criterion = (
        StableLatency(warmup.stable_last_n, warmup.stable_within_pct)
        if warmup.success == "stable"
        else FixedCount(warmup.min_successes)
    )
    return ProbePlan([p.count for p in warmup.probes], criterion)


async def read_bodies(probes: Sequence[Probe]) -> list[bytes]:
    """Each probe's body; body_file is read now, so an edited file counts at the next warm-up."""
    return [await trio.Path(p.body_file).read_bytes() if p.body_file else p.body.encode("utf-8") for p in probes]


async def run_probes(
    client: httpx.AsyncClient,
    base_url: str,
    warmup: Warmup,
    plan: ProbePlan,
    bodies: Sequence[bytes],
    on_result: Callable[[ProbeResult], None],
) -> Verdict:
    """Send `plan`'s probes with `warmup.concurrency` in flight until its verdict is in."""
    async with trio.open_nursery() as nursery:
        for _ in range(min(warmup.concurrency, sum(plan.counts))):
            nursery.start_soon(_worker, client, base_url, warmup, plan, bodies, on_result, nursery.cancel_scope)
    return plan.verdict()


async def _worker(client, base_url, warmup, plan, bodies, on_result, all_workers: trio.CancelScope) -> None:
    while (shape := plan.next_probe()) is not None:
        result = await send_probe(client, base_url, warmup, shape, bodies[shape])
        plan.record(result)
        on_result(result)
        if plan.verdict().done:
            all_workers.cancel()  # probes still in flight no longer matter
            return


async def send_probe(client: httpx.AsyncClient, base_url: str, warmup: Warmup, shape: int, body: bytes) -> ProbeResult:
    """One probe of `warmup.probes[shape]`; its latency runs until the whole response body has arrived."""
    probe = warmup.probes[shape]
    headers = {"content-type": probe.content_type} if body else {}
    started = trio.current_time()
    if probe.grpc:
        return await _grpc_probe(base_url, warmup, shape, body, started)
    with trio.move_on_after(warmup.probe_timeout_ms / 1000):
        try:
            response = await client.request(probe.method, base_url + probe.path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return ProbeResult(shape, False, trio.current_time() - started, _error(exc))
        ok = 200 <= response.status_code < 300
        return ProbeResult(shape, ok, trio.current_time() - started, str(response.status_code))
    return ProbeResult(shape, False, trio.current_time() - started, "timeout")


async def _grpc_probe(base_url: str, warmup: Warmup, shape: int, body: bytes, started: float) -> ProbeResult:
    url = httpx.URL(base_url)
    path = warmup.probes[shape].path.encode()
    with trio.move_on_after(warmup.probe_timeout_ms / 1000):
        ok, detail, _ = await grpc_health.unary(url.host, url.port or 80, path, body)
        return ProbeResult(shape, ok, trio.current_time() - started, detail)
    return ProbeResult(shape, False, trio.current_time() - started, "timeout")


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
