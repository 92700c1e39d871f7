"""The load generator of bench.grpc: an asynchronous grpcio client (grpc.aio), open and closed loop.

Open loop: call i starts at t0 + i / rate whatever the earlier calls do, and its latency runs
from that scheduled start (no coordinated omission). Closed loop: `concurrency` workers, each
starting its next call when the last one ended. Messages are raw bytes (no generated code).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
from grpc import aio

from proxy.testing.grpc_servicer import SERVICE

_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def retrying_options(max_attempts: int = 5, service: str = SERVICE) -> list[tuple[str, object]]:
    """A gRPC retry policy for UNAVAILABLE with a 10 ms backoff of its own: what it waits beyond that
    is the server's grpc-retry-pushback-ms (gRFC A6)."""
    config = {
        "methodConfig": [
            {
                "name": [{"service": service}],
                "retryPolicy": {
                    "maxAttempts": max_attempts,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.01s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return [*_OPTIONS, ("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]


@dataclass
class Run:
    seconds: float = 0.0  # until the last call ended
    offered_s: float = 0.0  # open loop: how long calls were started (goodput is per second of it)
    latencies_ms: list[float] = field(default_factory=list)  # of the calls that ended OK
    ok_at_s: list[float] = field(default_factory=list)  # when each OK call ended, from the start of the run
    t0: float = 0.0
    codes: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)  # x-rampmeter-reason of calls that ended rejected
    pushback_ms: list[int] = field(default_factory=list)  # grpc-retry-pushback-ms of calls that ended rejected

    @property
    def ok(self) -> int:
        return self.codes.get("OK", 0)

    def goodput(self, skip_s: float = 1.0) -> float:
        """OK calls per second that ended inside the offered window, after the first `skip_s` (the ramp):
        calls that end in the tail after it (served late from a queue) do not inflate it."""
        window = max(1e-9, self.offered_s - skip_s)
        return sum(1 for t in self.ok_at_s if skip_s <= t <= self.offered_s) / window

    @property
    def calls(self) -> int:
        return sum(self.codes.values())


async def _call(stub, payload: bytes, timeout: float, run: Run, started: float) -> None:
    try:
        await stub(payload, timeout=timeout)
        now = time.perf_counter()
        run.latencies_ms.append((now - started) * 1000.0)
        run.ok_at_s.append(now - run.t0)
        run.codes["OK"] += 1
    except aio.AioRpcError as exc:
        run.codes[exc.code().name] += 1
        for key, value in exc.trailing_metadata() or ():
            if key == "x-rampmeter-reason":
                run.reasons[value] += 1
            elif key == "grpc-retry-pushback-ms" and value.lstrip("-").isdigit():
                run.pushback_ms.append(int(value))


async def open_loop(
    target: str,
    method: str,
    payload: bytes,
    rate: float,
    seconds: float,
    timeout: float = 5.0,
    options=None,
    service: str = SERVICE,
    warm: bool | None = None,
) -> Run:
    """`warm` (default: for Unary): one call before the clock starts."""
    run = Run()
    async with aio.insecure_channel(target, options=options or _OPTIONS) as channel:
        stub = channel.unary_unary(f"/{service}/{method}")
        if method == "Unary" if warm is None else warm:
            await stub(payload, timeout=60)  # the connection is up before the clock starts (a busy machine: late)
        tasks = []
        t0 = run.t0 = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            at = t0 + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(_call(stub, payload, timeout, run, at)))
        run.offered_s = n / rate
        await asyncio.gather(*tasks)
        run.seconds = time.perf_counter() - t0
    return run


async def closed_loop(
    target: str, method: str, payload: bytes, concurrency: int, seconds: float, service: str = SERVICE
) -> Run:
    run = Run()
    async with aio.insecure_channel(target, options=_OPTIONS) as channel:
        stub = channel.unary_unary(f"/{service}/{method}")
        t0 = run.t0 = time.perf_counter()
        end = t0 + seconds

        async def worker() -> None:
            while time.perf_counter() < end:
                await _call(stub, payload, 10.0, run, time.perf_counter())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - t0
    return run


def outcome(target: str) -> list:
    """What a client sees of unary, server-streaming and failing calls (bench's `identical` check)."""
    seen = []
    with grpc.insecure_channel(target, options=_OPTIONS) as ch:
        for name, kind, request in (
            ("Unary", "unary_unary", b"same?"),
            ("ServerStream", "unary_stream", b"5"),
            ("Fail", "unary_unary", b"bad"),
        ):
            call = getattr(ch, kind)(f"/{SERVICE}/{name}")
            try:
                if kind == "unary_stream":
                    it = call(request, timeout=10)
                    messages, state = list(it), it
                else:
                    messages, state = call.with_call(request, timeout=10)
            except grpc.RpcError as exc:
                messages, state = None, exc
            trailers = [
                (m.key, m.value)
                for m in state.trailing_metadata() or ()
                if m.key not in ("via", "x-request-id") and not m.key.startswith("x-rampmeter-")  # the sidecar's own
            ]
            seen.append((name, messages, state.code().name, state.details(), trailers))
    return seen
