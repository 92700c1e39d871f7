"""client_sdk quickstart: one call with options, the error tree, statistics.

    python examples/sdk_quickstart.py                       # offline: a simulated busy pod
    python examples/sdk_quickstart.py http://127.0.0.1:8080 # a real sidecar or model server

Offline, the "pod" is an httpx.MockTransport that answers like the rampmeter
sidecar: 503 queue_full (with Retry-After) for about half of the attempts. Watch the
SDK retry with backoff, reuse one idempotency key per call, and report what it did.
"""

from __future__ import annotations

import logging
import random
import sys

import httpx

import client_sdk
from client_sdk import wire


def simulated_pod(seed: int = 7) -> httpx.MockTransport:
    """A pod whose sidecar rejects ~half the attempts with queue_full."""
    rng = random.Random(seed)

    def handle(request: httpx.Request) -> httpx.Response:
        if rng.random() < 0.5:
            body = {
                "error": {
                    "type": wire.ERROR_TYPE,
                    "code": "queue_full",
                    "message": "admission queue is full",
                    "retry_after_ms": 50,
                }
            }
            headers = {wire.REASON: "queue_full", wire.RETRY_AFTER: "1", wire.RETRY_AFTER_MS: "50"}
            return httpx.Response(503, headers=headers, json=body)
        return httpx.Response(200, json={"echo": request.headers.get(wire.IDEMPOTENCY_KEY)})

    return httpx.MockTransport(handle)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    base_url = argv[1] if len(argv) > 1 else "http://pod.invalid"
    config = client_sdk.RetryConfig(max_attempts=3, deadline_s=5.0)  # the other defaults suit most apps
    transport = simulated_pod() if len(argv) <= 1 else None
    with client_sdk.Client(base_url, config=config, transport=transport, hooks=client_sdk.LoggingHooks()) as client:
        for i in range(5):
            try:
                response = client.post(
                    "/v1/completions",
                    json={"prompt": f"hello {i}", "max_tokens": 16},
                    priority="interactive",
                    cost_hint=32,
                    deadline_s=2.0,
                )
                summary = response.extensions["rampmeter"]
                print(f"call {i}: {response.status_code} after {summary.attempts} attempt(s)")
            except client_sdk.Overloaded as exc:
                print(f"call {i}: overloaded ({exc.reason}), server asked for {exc.retry_after}s")
            except client_sdk.RampmeterClientError as exc:
                print(f"call {i}: {type(exc).__name__}: {exc}")
        stats = client.statistics()
        print(
            f"calls={stats.calls} attempts={stats.attempts} retries={stats.retries} throttled={stats.throttled_locally}"
        )
        for host, host_stats in stats.hosts.items():
            print(
                f"{host}: budget {host_stats.budget_tokens:.1f} tokens, "
                f"throttle p={host_stats.throttle_probability:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
