"""The calibration driver: probes a running model server and returns what it measured.

Theory of operation: `await calibrate(options)` runs the steps below against
`options.url`, one after the other, and returns a `Calibration` value (every
figure, with where it came from); `render.policy_toml()` turns it into a
commented policy. Nothing here decides a policy value: `fit.py` does.

1. Health: the sidecar's own discovery (`proxy.runtime.probes.check_health`
   with `proxy.core.health.HealthDiscovery`), retried with its backoff until a
   path answers 2xx or `wait_s` passes (a server still loading is waited for).
2. API: the model name from /v1/models (or /models), then each kind's candidate
   paths (`shapes.ENDPOINTS`) with a one-token request; plus the user's
   `--request`s. The first 2xx per kind is a route.
3. Service time per shape, alone: one request per shape through httpx (it
   warms the server and reads `usage`: real token counts, so chars_per_token),
   then a one-user closed loop of proxy.loadtest over every shape at once for
   `reps` requests per shape; medians fit the route's priors.
4. The knee: closed-loop steps of the load generator at 1, 2, 4, ... users on
   the first route's short shape, until throughput is flat (`fit.sweep_done`).
5. Under load: one mixed closed loop of every shape plus the long request
   below, with the limit's worth of users (the server as the sidecar will keep
   it): each shape's p99 there is a candidate for the budgets' turn
   (`fit.turn`). Skipped for a serial server (limit 1: alone is its load) and a
   single fixed request (the sweep measured it).
6. Whether a disconnect stops the work: `trials` times, fill the engine (the
   knee's worth of long requests on raw sockets), close them all after a third
   of their time alone, then either watch the engine's running gauge drain (when
   /metrics has `vllm:num_requests_running`) or time a short request against its
   time alone; between trials the server is let go idle.
7. Engine queue gauges on /metrics (vLLM's waiting/running, Triton's pending
   count), for `[limits] kind = "engine_queue"`.

Everything is bounded: each request by `timeout_s`, each sweep step by
`max_step_s`, the health wait by `wait_s`.
"""

from __future__ import annotations

import logging
import math
import statistics as stats_
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import msgspec
import trio
from prometheus_client.parser import text_string_to_metric_families

from proxy import loadtest as lt
from proxy.calibrate import shapes as cs
from proxy.calibrate.fit import (
    CancelTrial,
    Coefficients,
    Loaded,
    Point,
    SweepStep,
    cancel_verdict,
    engine_batch,
    fit_service,
    knee,
    limit_for,
    turn,
)
from proxy.calibrate.fit import sweep_done as sweep_is_done
from proxy.core.health import HealthDiscovery, next_check_in
from proxy.http.pool import parse_url
from proxy.http.upstream_h1 import framed
from proxy.policy.warmup import Warmup
from proxy.runtime.probes import check_health, new_client

log = logging.getLogger("rampmeter.calibrate")

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting", "nv_inference_pending_request_count")
GENERATED = "vllm:generation_tokens_total"  # a counter: moves while the engine generates
CANCEL_AT = 0.3  # drop the long requests after this share of their time alone
GAUGE_POLL_S = 0.05
SETTLE_S = 0.05  # after the drop, before the short request or the gauge watch
MAX_LONG_TOKENS = 2048
LONG_TARGET_MS = 1000.0  # the cancel test's long request: at least this long alone ...
LONG_TIMES_SHORT = 8.0  # ... and this many short requests
LOADED_LONGS = 8.0  # the loaded step lasts this many long requests' time alone (within the step bounds)


@dataclass(frozen=True)
class Options:
    url: str
    model: str | None = None
    requests: tuple[cs.Endpoint, ...] = ()  # user-named fixed requests (Triton infer, /predict)
    kinds: tuple[str, ...] = ("chat", "completions", "embeddings")
    max_concurrency: int = 64
    reps: int = 5  # requests per shape for the alone medians
    min_step_s: float = 1.0
    max_step_s: float = 30.0
    trials: int = 3
    wait_s: float = 60.0
    timeout_s: float = 120.0
    metrics_path: str = "/metrics"


@dataclass(frozen=True)
class ShapeFigure:
    label: str
    kind: str
    path: str
    prompt_tokens: float
    output_tokens: float
    p50_ms: float
    samples: int
    usage: bool  # token counts from the server's usage, not from what was asked
    body: bytes = b""


@dataclass(frozen=True)
class RouteCalibration:
    endpoint: cs.Endpoint
    coefficients: Coefficients
    shapes: tuple[ShapeFigure, ...]
    chars_per_token: float | None  # measured from usage; None: not reported
    fill_ratio: float | None  # generated / requested output tokens, from usage


@dataclass(frozen=True)
class Calibration:
    url: str
    health: str  # HealthDiscovery.describe()
    health_path: str | None
    model: str | None
    tried: tuple[str, ...]  # "POST /v1/chat/completions 404", ...
    routes: tuple[RouteCalibration, ...]
    sweep_label: str
    sweep: tuple[SweepStep, ...]
    knee: SweepStep
    limit: int  # the knee, capped at the engine's own batch (fit.limit_for)
    engine_batch: int | None
    long_label: str
    long_alone_ms: float
    cancel_trials: tuple[CancelTrial, ...]
    stops_on_cancel: bool | None
    engine_gauges: tuple[str, ...]  # gauge names found on metrics_path
    metrics_path: str
    duration_s: float
    notes: tuple[str, ...] = field(default=())
    loaded: tuple[Loaded, ...] = ()  # each shape with the limit's worth in flight (step 5)
    long_output_tokens: float = 0.0  # the long request's output tokens, as asked

    @property
    def short(self) -> ShapeFigure:
        return self.routes[0].shapes[0]

    @property
    def turn(self) -> tuple[float, str]:
        """One turn (ms, what it is): the slowest request measured, under load where it was (`fit.turn`)."""
        alone = [(s.label, s.p50_ms) for r in self.routes for s in r.shapes] + [(self.long_label, self.long_alone_ms)]
        return turn(self.knee, self.sweep_label, alone, self.loaded)

    @property
    def turn_ms(self) -> float:
        return self.turn[0]


class CalibrationError(Exception):
    """The server could not be calibrated (down, no route answered); the message says why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status that ended it, if one did


async def calibrate(options: Options) -> Calibration:
    started = time.monotonic()
    url = options.url.rstrip("/")
    notes: list[str] = []
    async with new_client(8) as client:
        discovery = await _wait_healthy(client, url, options)
        model = options.model or await _model_name(client, url)
        endpoints, tried = await _endpoints(client, url, model, options)
        if not endpoints:
            raise CalibrationError(f"no route answered 2xx at {url}: {', '.join(tried)}; name one with --request")
        cal_shapes, usage = {}, {}
        for e in endpoints:
            kept = []
            for wanted in cs.shapes_for(e, model):
                fitted = await _fitting(client, url, e, model, wanted, options, notes)
                if fitted is not None:
                    kept.append(fitted[0])
                    usage[fitted[0].label] = fitted[1]
            cal_shapes[e] = tuple(kept)
    alone = await _alone(url, [s for e in endpoints for s in cal_shapes[e]], usage, options)
    routes = tuple(_route(e, cal_shapes[e], usage, alone) for e in endpoints)
    short = cal_shapes[endpoints[0]][0]
    async with new_client(4) as client:
        gauges = await _gauges(client, url + options.metrics_path)
        steps = await _sweep(client, url, short, alone[short.label].p50_ms, options, watch=RUNNING[0] in gauges)
    at_knee = knee(steps)
    limit = limit_for(steps)
    async with new_client(4) as client:
        long_cal, long_ms = await _long_request(client, url, endpoints[0], model, routes[0], options)
        every = [s for e in endpoints for s in cal_shapes[e]] + [long_cal]
        loaded = await _loaded(url, every, long_ms, limit, options)
        trials = await _cancel_trials(client, url, options, short, long_cal, long_ms, alone, limit, gauges)
    if at_knee.concurrency >= options.max_concurrency:
        notes.append(f"throughput still grew at --max-concurrency {options.max_concurrency}: the knee may be higher")
    return Calibration(
        url=url,
        health=discovery.describe(),
        health_path=discovery.found,
        model=model,
        tried=tuple(tried),
        routes=routes,
        sweep_label=short.label,
        sweep=tuple(steps),
        knee=at_knee,
        limit=limit,
        engine_batch=engine_batch(steps),
        long_label=long_cal.label,
        long_alone_ms=long_ms,
        cancel_trials=tuple(trials),
        stops_on_cancel=cancel_verdict(trials),
        engine_gauges=tuple(sorted(gauges)),
        metrics_path=options.metrics_path,
        duration_s=time.monotonic() - started,
        notes=tuple(notes),
        loaded=loaded,
        long_output_tokens=long_cal.max_tokens,
    )


# --- 1, 2: health and API ------------------------------------------------------------------


async def _wait_healthy(client: httpx.AsyncClient, url: str, options: Options) -> HealthDiscovery:
    warmup = Warmup()
    discovery = HealthDiscovery("", warmup.health_candidates)
    deadline = trio.current_time() + options.wait_s
    failures = 0
    while True:
        result = await check_health(client, url, warmup, discovery)
        if result.ok:
            log.info("calibrate: %s", result.detail)
            return discovery
        failures += 1
        if trio.current_time() >= deadline:
            raise CalibrationError(f"{url} not healthy after {options.wait_s:g} s: {result.detail}")
        await trio.sleep(next_check_in(failures, 2.0))


async def _model_name(client: httpx.AsyncClient, url: str) -> str | None:
    for path in cs.MODEL_PATHS:
        try:
            resp = await client.get(url + path, timeout=5.0)
            data = msgspec.json.decode(resp.content) if resp.is_success else None
        except (httpx.HTTPError, msgspec.DecodeError, RecursionError):
            continue
        if isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"]:
            first = data["data"][0]
            if isinstance(first, dict) and isinstance(first.get("id"), str):
                return first["id"]
    return None


async def _endpoints(
    client: httpx.AsyncClient, url: str, model: str | None, options: Options
) -> tuple[list[cs.Endpoint], list[str]]:
    found, tried = [], []
    for kind in options.kinds:
        for path in cs.ENDPOINTS[kind]:
            probe = cs.probe_shape(kind, path, model)
            status = await _status(client, url, probe, options)
            tried.append(f"POST {path} {status}")
            if isinstance(status, int) and 200 <= status < 300:
                found.append(cs.Endpoint(kind, path))
                break
            if status not in (404, 405):
                break  # the path exists but refuses our probe (say so), or the server failed: no other prefix
    for request in options.requests:
        status = await _status(client, url, cs.shapes_for(request, model)[0].shape, options)
        tried.append(f"{request.method} {request.path} {status}")
        if isinstance(status, int) and 200 <= status < 300:
            found.append(request)
        else:
            raise CalibrationError(f"--request {request.path} answered {status}")
    return found, tried


async def _status(client: httpx.AsyncClient, url: str, shape: lt.Shape, options: Options) -> int | str:
    try:
        resp = await client.request(
            shape.method,
            url + shape.path,
            content=shape.body,
            headers={"content-type": "application/json"},
            timeout=options.timeout_s,
        )
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return resp.status_code


# --- 3: service time alone -----------------------------------------------------------------


@dataclass(frozen=True)
class _Usage:
    ms: float
    prompt_tokens: int | None
    completion_tokens: int | None


class _UsageBody(msgspec.Struct):
    usage: dict[str, int | float | None] | None = None


async def _one(client: httpx.AsyncClient, url: str, s: cs.CalShape, options: Options) -> _Usage:
    """One request of shape `s`: its latency and the server's token counts, if it reports them."""
    t0 = trio.current_time()
    resp = await client.request(
        s.shape.method,
        url + s.shape.path,
        content=s.shape.body,
        headers={"content-type": "application/json"},
        timeout=options.timeout_s,
    )
    ms = (trio.current_time() - t0) * 1000.0
    if not resp.is_success:
        message = f"{s.shape.path} ({s.label}) answered {resp.status_code}: {resp.text[:200]}"
        raise CalibrationError(message, resp.status_code)
    try:
        usage = msgspec.json.decode(resp.content, type=_UsageBody).usage or {}
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        usage = {}

    def count(key: str) -> int | None:
        value = usage.get(key)
        return int(value) if isinstance(value, int | float) and value > 0 else None

    return _Usage(ms, count("prompt_tokens"), count("completion_tokens"))


async def _fitting(client, url, endpoint, model, s: cs.CalShape, options: Options, notes: list[str]):
    """(shape, usage) of `s`, halving its prompt or output while the server refuses it as too long
    (a small max_model_len, a tokenizer with fewer characters per token); None when even the
    short size is refused (the shape is left out, and a note says so). The short shape must pass."""
    while True:
        try:
            return s, await _one(client, url, s, options)
        except CalibrationError as exc:
            if exc.status not in (400, 413, 422) or s.label == cs.shapes_for(endpoint, model)[0].label:
                raise
            smaller = cs.halved(s, endpoint, model)
            if smaller is None:
                notes.append(f"{s.label} left out: {exc}")
                return None
            s = smaller


async def _alone(url: str, shapes: Sequence[cs.CalShape], usage: dict[str, _Usage], options: Options):
    """Median latency of each shape, one request at a time (one closed-loop user over all shapes)."""
    guess_s = sum(u.ms for u in usage.values()) / 1000.0
    duration = min(options.max_step_s * 2, max(options.min_step_s, options.reps * guess_s))
    result = await _closed([s.shape for s in shapes], url, users=1, duration_s=duration, options=options)
    analysis = result.analyze(lt.SLA())
    figures = analysis.steps[0].by_shape
    out = {}
    for s in shapes:
        f = figures.get(s.label)
        u = usage[s.label]
        p50 = f.latency.p50_ms if f is not None and f.latency is not None and f.ok else u.ms
        out[s.label] = ShapeFigure(
            s.label,
            s.kind,
            s.shape.path,
            u.prompt_tokens if u.prompt_tokens is not None else s.prompt_tokens,
            u.completion_tokens if u.completion_tokens is not None else s.max_tokens,
            p50,
            f.ok if f is not None else 0,
            u.prompt_tokens is not None,
            s.shape.body,
        )
    return out


def _route(
    endpoint: cs.Endpoint, shapes: Sequence[cs.CalShape], usage: dict[str, _Usage], alone: dict[str, ShapeFigure]
) -> RouteCalibration:
    figures = tuple(alone[s.label] for s in shapes)
    coefficients = fit_service([Point(f.prompt_tokens, f.output_tokens, f.p50_ms) for f in figures])
    chars = None
    prompts = [(cs.prompt_chars(s.prompt_tokens), usage[s.label].prompt_tokens) for s in shapes]
    reported = sorted({(c, t) for c, t in prompts if t is not None})
    if len(reported) >= 2 and reported[-1][1] > reported[0][1]:
        # Differences cancel the chat template's own tokens.
        chars = (reported[-1][0] - reported[0][0]) / (reported[-1][1] - reported[0][1])
    fills = [
        completion / s.max_tokens
        for s in shapes
        if s.max_tokens and (completion := usage[s.label].completion_tokens) is not None
    ]
    fill = min(1.0, stats_.fmean(fills)) if fills else None
    return RouteCalibration(endpoint, coefficients, figures, chars, fill)


# --- 4: the knee ---------------------------------------------------------------------------


async def _sweep(client, url: str, short: cs.CalShape, alone_ms: float, options: Options, *, watch: bool):
    steps: list[SweepStep] = []
    users = 1
    rate = 1000.0 / max(alone_ms, 0.1)  # requests/s at 1 user, before it is measured
    while users <= options.max_concurrency:
        # Enough time for ~30 answers at the last rate and a few rounds per user, within the bounds.
        duration = min(options.max_step_s, max(options.min_step_s, 30.0 / rate, 4.0 * users / rate))
        seen: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            if watch:
                nursery.start_soon(_watch_gauges, client, url + options.metrics_path, seen)
            result = await _closed([short.shape], url, users=users, duration_s=duration, options=options)
            nursery.cancel_scope.cancel()
        fig = result.analyze(lt.SLA()).steps[0].overall
        latency = fig.latency
        step = SweepStep(
            users,
            fig.achieved_rps,
            latency.p50_ms if latency else math.inf,
            latency.p99_ms if latency else math.inf,
            fig.requests,
            fig.requests - fig.ok,
            seen.get(RUNNING[0]),
            seen.get(WAITING[0]),
        )
        steps.append(step)
        log.info("calibrate: %d users: %.1f req/s, p50 %.0f ms %s", users, step.throughput_rps, step.p50_ms, seen or "")
        if sweep_is_done(steps):
            break
        rate = max(rate, step.throughput_rps)
        users *= 2
    return steps


async def _watch_gauges(client, metrics_url: str, seen: dict[str, float]) -> None:
    """Highest value of each engine gauge while a sweep step runs (skipping its first tenth of a second)."""
    await trio.sleep(0.1)
    while True:
        for name, value in (await _gauges(client, metrics_url)).items():
            seen[name] = max(value, seen.get(name, value))
        await trio.sleep(GAUGE_POLL_S * 2)


async def _closed(shapes: Sequence[lt.Shape], url: str, *, users: int, duration_s: float, options: Options):
    plan = lt.Plan((lt.Step(users, duration_s, warmup_s=min(duration_s / 5, 1.0)),), mode="closed")
    trace = lt.build_trace(plan, lt.Mix(tuple(shapes)), seed=users)
    target = lt.Target(url, timeout_s=options.timeout_s, check_json=False)
    return await lt.run(trace, target)


# --- 5: under load -------------------------------------------------------------------------


async def _loaded(url: str, shapes: Sequence[cs.CalShape], long_ms: float, users: int, options: Options):
    """Each shape's latency in one mixed closed loop of `users` (see the module doc, step 5)."""
    unique = list({s.label: s for s in shapes}.values())
    if users <= 1 or len(unique) <= 1:
        return ()
    duration = min(options.max_step_s, max(options.min_step_s, LOADED_LONGS * long_ms / 1000.0))
    result = await _closed([s.shape for s in unique], url, users=users, duration_s=duration, options=options)
    figures = result.analyze(lt.SLA()).steps[0].by_shape
    out = []
    for s in unique:
        f = figures.get(s.label)
        if f is None or f.latency is None or not f.ok:
            continue
        out.append(Loaded(s.label, users, f.latency.p50_ms, f.latency.p99_ms, f.ok, s.max_tokens))
        log.info(
            "calibrate: %s with %d in flight: p50 %.0f p99 %.0f ms", s.label, users, out[-1].p50_ms, out[-1].p99_ms
        )
    return tuple(out)


# --- 6: does a disconnect stop the work? ----------------------------------------------------


async def _gauges(client: httpx.AsyncClient, metrics_url: str) -> dict[str, float]:
    """The engine gauges this server exports (summed over labels); {} without /metrics."""
    try:
        resp = await client.get(metrics_url, timeout=5.0)
    except httpx.HTTPError:
        return {}
    if not resp.is_success:
        return {}
    return parse_gauges(resp.text)


def parse_gauges(text: str) -> dict[str, float]:
    wanted = (*RUNNING, *WAITING, GENERATED)
    lines = "\n".join(line for line in text.splitlines() if line.startswith(wanted))
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(lines + "\n"):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def _long_request(client, url, endpoint, model, route: RouteCalibration, options: Options):
    """The cancel test's long request and its time alone (median of two)."""
    if endpoint.kind in ("chat", "completions"):
        c = route.coefficients
        short_ms = route.shapes[0].p50_ms
        target = max(LONG_TARGET_MS, LONG_TIMES_SHORT * short_ms)
        per_token = max(c.ms_per_output_token, 1e-3)
        tokens = int(min(MAX_LONG_TOKENS, max(cs.LONG_OUTPUT, (target - c.base_ms) / per_token)))
        ignore_eos = False
        while True:
            long_cal = cs.long_shape(endpoint, model, tokens, ignore_eos=ignore_eos)
            try:
                first = await _one(client, url, long_cal, options)
            except CalibrationError:
                if tokens <= cs.LONG_OUTPUT:
                    raise
                tokens //= 2  # longer than the server allows (max_model_len): halve
                continue
            if ignore_eos or first.completion_tokens is None or first.completion_tokens >= tokens // 2:
                break
            ignore_eos = True  # the model stops early (EOS): ask vLLM-style servers to go on
    else:
        long_cal = cs.long_shape(endpoint, model, 0)
        first = await _one(client, url, long_cal, options)
    second = await _one(client, url, long_cal, options)
    return long_cal, min(first.ms, second.ms)


async def _cancel_trials(client, url, options, short, long_cal, long_ms, alone, limit, gauges) -> list[CancelTrial]:
    fill = max(1, min(limit, 16))
    short_alone = alone[short.label].p50_ms
    watch_gauge = RUNNING[0] in gauges
    work_left_ms = long_ms * (1.0 - CANCEL_AT) - SETTLE_S * 1000.0
    trials = []
    for _ in range(options.trials):
        await _fill_and_drop(url, long_cal, fill, CANCEL_AT * long_ms / 1000.0)
        await trio.sleep(SETTLE_S)
        if watch_gauge:
            drained, watched = await _watch_drain(client, url + options.metrics_path, work_left_ms / 1000.0)
            trials.append(CancelTrial("gauge", work_left_ms, drained_ms=drained, watched_ms=watched))
        else:
            one = await _one(client, url, short, options)
            trials.append(CancelTrial("latency", work_left_ms, delay_ms=one.ms - short_alone))
        log.info("calibrate: cancel trial: %s", trials[-1].describe())
        await _wait_idle(client, url, short, short_alone, long_ms, fill, options)
    return trials


async def _fill_and_drop(url: str, long_cal: cs.CalShape, fill: int, after_s: float) -> None:
    """Open `fill` connections, send the long request on each, and close them all after `after_s`."""
    host, port, prefix = parse_url(url)
    payload = _h1_request(long_cal.shape, host, port, prefix)
    streams = []
    try:
        for _ in range(fill):
            stream = await trio.open_tcp_stream(host, port)
            streams.append(stream)
            await stream.send_all(payload)
        await trio.sleep(after_s)
    finally:
        for stream in streams:
            with trio.CancelScope(shield=True):
                await stream.aclose()


def _h1_request(shape: lt.Shape, host: str, port: int, prefix: bytes) -> bytes:
    headers = framed(
        shape.method.encode(),
        [(b"host", f"{host}:{port}".encode()), (b"content-type", b"application/json")],
        shape.body,
    )
    head = b"%s %s HTTP/1.1\r\n" % (shape.method.encode(), prefix + shape.path.encode())
    return head + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + shape.body


async def _watch_drain(client, metrics_url: str, watch_s: float) -> tuple[float | None, float]:
    """ms until the engine stops after the drop (None: not within `watch_s`), and ms watched.

    Stopped: running + waiting read 0, or the generated-token counter stood still
    between two reads (a gauge an idle engine no longer refreshes must not read
    as work going on)."""
    t0 = trio.current_time()
    end = t0 + max(watch_s, GAUGE_POLL_S)
    tokens = None
    while trio.current_time() < end:
        gauges = await _gauges(client, metrics_url)
        now = trio.current_time()
        busy = sum(gauges.get(n, 0.0) for n in (*RUNNING, WAITING[0]))
        counted = gauges.get(GENERATED)
        if gauges and (busy == 0 or (tokens is not None and counted is not None and counted == tokens)):
            return (now - t0) * 1000.0, (now - t0) * 1000.0
        tokens = counted
        await trio.sleep(GAUGE_POLL_S * 2)
    return None, (trio.current_time() - t0) * 1000.0


async def _wait_idle(client, url, short, short_alone_ms, long_ms, fill, options) -> None:
    """Until a short request takes about its time alone again (orphans finished), bounded."""
    deadline = trio.current_time() + 3.0 * long_ms / 1000.0 * max(1, fill) + 1.0
    while trio.current_time() < deadline:
        one = await _one(client, url, short, options)
        if one.ms <= 1.5 * short_alone_ms + 5.0:
            return
        await trio.sleep(min(0.5, long_ms / 4000.0))
