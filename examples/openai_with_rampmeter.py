"""The OpenAI Python SDK through client_sdk's ResilientTransport.

    python examples/openai_with_rampmeter.py                             # offline, simulated pod
    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 python examples/openai_with_rampmeter.py --live

Two settings matter:
- `max_retries=0` on the OpenAI client: the transport retries (with the per-host
  budget and adaptive throttle the OpenAI SDK lacks); two layers of retries would
  multiply load, which is exactly the storm this SDK exists to prevent.
- Per-call rampmeter options go as headers (`extra_headers`): `x-priority`,
  `x-cost-hint`, `x-tenant`, and `x-request-timeout-ms`, which the transport
  treats as the call's total deadline and re-stamps with the remaining budget on
  each attempt.
A sidecar rejection that outlives the retries surfaces as the usual OpenAI error
(`openai.RateLimitError` for 429 tenant_quota, `openai.InternalServerError` for
503) with `code` set to the rampmeter reason.
"""

from __future__ import annotations

import os
import sys

import httpx
import openai

from client_sdk import ResilientTransport, RetryConfig, wire


def simulated_pod() -> httpx.MockTransport:
    """First attempt of each call: 503 not_ready; then a completion."""
    seen: set[str] = set()

    def handle(request: httpx.Request) -> httpx.Response:
        key = request.headers.get(wire.IDEMPOTENCY_KEY, "")
        if key not in seen:
            seen.add(key)
            return httpx.Response(
                503,
                headers={wire.REASON: "not_ready", wire.RETRY_AFTER_MS: "20"},
                json={
                    "error": {
                        "type": wire.ERROR_TYPE,
                        "code": "not_ready",
                        "message": "warming up",
                        "retry_after_ms": 20,
                    }
                },
            )
        return httpx.Response(
            200,
            json={
                "id": "chatcmpl-demo",
                "object": "chat.completion",
                "created": 0,
                "model": "demo",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "Hello from behind rampmeter."},
                    }
                ],
            },
        )

    return httpx.MockTransport(handle)


def main(argv: list[str]) -> int:
    live = "--live" in argv
    inner = httpx.HTTPTransport() if live else simulated_pod()
    transport = ResilientTransport(inner, RetryConfig(max_attempts=3))
    client = openai.OpenAI(
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed-for-a-local-pod"),
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"),
        http_client=httpx.Client(transport=transport),
        max_retries=0,
    )
    try:
        reply = client.chat.completions.create(
            model=os.environ.get("MODEL", "demo"),
            messages=[{"role": "user", "content": "Say hello."}],
            extra_headers={wire.PRIORITY: "interactive", wire.REQUEST_TIMEOUT_MS: "10000"},
        )
    except openai.APIStatusError as exc:
        print(f"rejected: {exc.status_code} {exc.code}")
        return 1
    print(reply.choices[0].message.content)
    stats = transport.statistics()
    print(f"attempts={stats.attempts} retries={stats.retries}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
