"""The client populations of the retry-storm benchmark, and what each call records.

Theory of operation: a population turns one logical request (a `Call`) into one
or more HTTP attempts and records, on the `Call`, how many attempts it made,
when it ended and how (`outcome`: a status code or an error name). Every attempt
also appends its send time to the shared `Recorder`, which gives attempts per
second over time. All three send the same request the same way (httpx
AsyncClient under trio, one keep-alive pool without a practical connection cap,
so the client itself never queues); they differ only in how they retry:

- naive: a 1 s timeout per attempt, any failure (timeout, connection error,
  5xx, 429) retried at once, 3 attempts. What a hand-written `for` loop does.
- fixed: the same, but it sleeps a fixed 0.5 s before each retry (no jitter,
  no Retry-After). What many retry decorators do by default.
- sdk: `client_sdk.AsyncClient` with its defaults (3 attempts, budget,
  throttle, jittered backoff above Retry-After) and a 3 s deadline per call.
  Its attempts are counted with `Hooks.on_attempt`; which call an attempt
  belongs to travels in a ContextVar (each call is its own trio task, and the
  SDK calls hooks synchronously inside it).
- openai: the plain OpenAI SDK (`openai.AsyncOpenAI`, no client_sdk) with its
  own retries (max_retries=2: its backoff, Retry-After honoured up to 120 s,
  x-should-retry obeyed) and the sdk population's 3 s: `timeout=3` and, so the
  sidecar knows it too, `x-request-timeout-ms: 3000` on every attempt (a static
  header: each retry claims a fresh 3 s). Attempts are counted by an inner httpx
  transport.
- openai_oldheaders: the same, but the inner transport removes `retry-after-ms`
  and `x-should-retry` from every answer: what the OpenAI SDK saw from the
  sidecar before it sent them (only `retry-after`, in whole seconds rounded up).
  With the sidecar only (the pod sends neither).

For the mixed workload (bench/retry_storm/mixed.py: no deadline, a healthy pod):
sdk_nodeadline (client_sdk.AsyncClient, no deadline), openai_defaults (the
OpenAI SDK exactly as it comes: max_retries=2, 600 s timeout) and openai_sdk
(the OpenAI SDK over `client_sdk.AsyncResilientTransport`, max_retries=0: the
README's set-up). Each call there carries its own body (`Call.body`).

The per-attempt timeout of naive and fixed is total, not per I/O phase:
`trio.move_on_after`, with httpx's own timeouts off.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from array import array

import httpx
import openai
import trio

import client_sdk

ATTEMPTS = 3
NAIVE_TIMEOUT_S = 1.0
FIXED_INTERVAL_S = 0.5
SDK_DEADLINE_S = 3.0
LIMITS = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
HEADERS = {"content-type": "application/json"}


class Call:
    """One logical request: intended send time (s from the trace start) and its fate."""

    __slots__ = ("attempts", "body", "end", "intended", "kind", "outcome")

    def __init__(self, intended: float, body: bytes | None = None, kind: str = "") -> None:
        self.intended = intended
        self.body = body  # None: the population's own body
        self.kind = kind  # the mixed workload's "short" / "long"
        self.attempts = 0
        self.end: float | None = None
        self.outcome = "unfinished"

    @property
    def ok(self) -> bool:
        return self.outcome.startswith("2")

    def __repr__(self) -> str:
        return f"<Call t={self.intended:.3f} attempts={self.attempts} {self.outcome}>"


class Recorder:
    """Clock origin and every attempt's send time (seconds from the trace start)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.attempt_times = array("d")

    def now(self) -> float:
        return trio.current_time() - self.t0

    def attempt(self, call: Call) -> None:
        call.attempts += 1
        self.attempt_times.append(self.now())


class _LoopPopulation:
    """naive and fixed: a plain retry loop over httpx, differing only in the pause."""

    name = "?"
    pause_s = 0.0
    sidecar_modes = (False, True)

    def __init__(self, base_url: str, path: str, body: bytes, recorder: Recorder) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=None, limits=LIMITS, trust_env=False)
        self.path, self.body, self.recorder = path, body, recorder

    async def call(self, call: Call) -> None:
        outcome = "none"
        for attempt in range(ATTEMPTS):
            if attempt and self.pause_s:
                await trio.sleep(self.pause_s)
            self.recorder.attempt(call)
            outcome = await self._attempt(call.body or self.body)
            if outcome.isdigit() and int(outcome) < 500 and outcome != "429":
                break  # an answer: success, or an error retrying cannot fix
        call.outcome, call.end = outcome, self.recorder.now()

    async def _attempt(self, body: bytes) -> str:
        with trio.move_on_after(NAIVE_TIMEOUT_S):
            try:
                response = await self.http.post(self.path, content=body, headers=HEADERS)
            except httpx.HTTPError as exc:
                return type(exc).__name__
            return str(response.status_code)
        return "timeout"

    async def aclose(self) -> None:
        await self.http.aclose()


class Naive(_LoopPopulation):
    name = "naive"
    describe = f"{NAIVE_TIMEOUT_S:g} s timeout, immediate retry, {ATTEMPTS} attempts"


class Fixed(_LoopPopulation):
    name = "fixed"
    pause_s = FIXED_INTERVAL_S
    describe = f"{NAIVE_TIMEOUT_S:g} s timeout, retry after a fixed {FIXED_INTERVAL_S:g} s, {ATTEMPTS} attempts"


_current: contextvars.ContextVar[Call] = contextvars.ContextVar("retry_storm_call")


class _Counting(client_sdk.Hooks):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def on_attempt(self, info: client_sdk.AttemptInfo) -> None:
        self.recorder.attempt(_current.get())


class Sdk:
    name = "sdk"
    describe = f"client_sdk.AsyncClient, default RetryConfig, {SDK_DEADLINE_S:g} s deadline per call"
    sidecar_modes = (False, True)
    deadline_s: float | None = SDK_DEADLINE_S

    def __init__(self, base_url: str, path: str, body: bytes, recorder: Recorder) -> None:
        self.client = client_sdk.AsyncClient(
            base_url, hooks=_Counting(recorder), timeout=None, limits=LIMITS, trust_env=False
        )
        self.path, self.body, self.recorder = path, body, recorder

    async def call(self, call: Call) -> None:
        _current.set(call)  # this task's own context: hooks find their call here
        try:
            response = await self.client.post(
                self.path, content=call.body or self.body, headers=HEADERS, deadline_s=self.deadline_s
            )
            outcome = str(response.status_code)
        except client_sdk.Rejected as exc:
            outcome = f"{exc.status} {exc.reason}"
        except client_sdk.RetryBudgetExhausted as exc:
            last = exc.last
            if isinstance(last, httpx.Response):
                last = f"{last.status_code} {last.headers.get('x-rampmeter-reason', '')}".rstrip()
            outcome = f"RetryBudgetExhausted ({last if isinstance(last, str) else type(last).__name__})"
        except (client_sdk.RampmeterClientError, httpx.HTTPError) as exc:
            outcome = type(exc).__name__
        call.outcome, call.end = outcome, self.recorder.now()

    def statistics(self) -> dict:
        s = self.client.statistics()
        return {
            "calls": s.calls,
            "attempts": s.attempts,
            "retries": s.retries,
            "throttled_locally": s.throttled_locally,
            "gave_up": s.gave_up,
            "hosts": {h: dataclasses.asdict(v) for h, v in s.hosts.items()},
        }

    async def aclose(self) -> None:
        await self.client.aclose()


class SdkNoDeadline(Sdk):
    name = "sdk_nodeadline"
    describe = "client_sdk.AsyncClient, default RetryConfig, no deadline"
    deadline_s = None


class _CountingTransport(httpx.AsyncBaseTransport):
    """Inner transport: counts every attempt (the OpenAI SDK's retries included) for the call's task."""

    def __init__(self, recorder: Recorder, strip: tuple[str, ...] = ()) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=LIMITS, trust_env=False)
        self.recorder, self.strip = recorder, strip

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.recorder.attempt(_current.get())
        response = await self.inner.handle_async_request(request)
        for name in self.strip:
            if name in response.headers:
                del response.headers[name]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _openai_outcome(exc: Exception) -> str:
    if isinstance(exc, openai.APIStatusError):
        code = exc.code if isinstance(exc.code, str) else ""
        return f"{exc.status_code} {code}".rstrip()
    return type(exc).__name__  # APITimeoutError, APIConnectionError


class OpenAIPlain:
    """The OpenAI SDK as app teams run it: its own retries and timeouts, nothing of ours."""

    name = "openai"
    describe = (
        f"openai.AsyncOpenAI, no client_sdk: max_retries=2 (its default), timeout={SDK_DEADLINE_S:g} s and "
        f"x-request-timeout-ms: {SDK_DEADLINE_S * 1000:g} on every attempt"
    )
    sidecar_modes = (False, True)
    strip: tuple[str, ...] = ()
    max_retries = 2
    timeout_s: float | None = SDK_DEADLINE_S  # None: the OpenAI SDK's default (600 s), no deadline header

    def __init__(self, base_url: str, path: str, body: bytes, recorder: Recorder) -> None:
        self.recorder, self.body = recorder, body
        self.http = httpx.AsyncClient(transport=self._transport(recorder), timeout=None)
        options: dict = {}
        if self.timeout_s is not None:
            options["timeout"] = self.timeout_s
            options["default_headers"] = {"x-request-timeout-ms": str(round(self.timeout_s * 1000))}
        self.oai = openai.AsyncOpenAI(
            base_url=base_url + "/v1", api_key="unused", http_client=self.http, max_retries=self.max_retries, **options
        )

    def _transport(self, recorder: Recorder) -> httpx.AsyncBaseTransport:
        return _CountingTransport(recorder, self.strip)

    async def call(self, call: Call) -> None:
        _current.set(call)
        chat = json.loads(call.body or self.body)
        chat.setdefault("model", "sim")  # the storm's trace body names none; the sim pod accepts any
        try:
            await self.oai.chat.completions.create(**chat)
            outcome = "200"
        except openai.OpenAIError as exc:
            outcome = _openai_outcome(exc)
        call.outcome, call.end = outcome, self.recorder.now()

    async def aclose(self) -> None:
        await self.oai.close()
        await self.http.aclose()


class OpenAIOldHeaders(OpenAIPlain):
    name = "openai_oldheaders"
    describe = "the same, seeing only the headers the sidecar sent before retry-after-ms and x-should-retry"
    sidecar_modes = (True,)
    strip = ("retry-after-ms", "x-should-retry")


class OpenAIDefaults(OpenAIPlain):
    name = "openai_defaults"
    describe = "openai.AsyncOpenAI exactly as it comes (max_retries=2, 600 s timeout, no deadline header)"
    timeout_s = None


class OpenAIOverSdk(OpenAIPlain):
    """The README's set-up: the OpenAI SDK's retries off, client_sdk's transport doing them."""

    name = "openai_sdk"
    describe = (
        "openai.AsyncOpenAI(max_retries=0) over client_sdk.AsyncResilientTransport (default RetryConfig), no deadline"
    )
    max_retries = 0
    timeout_s = None

    def _transport(self, recorder: Recorder) -> httpx.AsyncBaseTransport:
        self.resilient = client_sdk.AsyncResilientTransport(_CountingTransport(recorder))
        return self.resilient

    def statistics(self) -> dict:
        s = self.resilient.statistics()
        return {
            "calls": s.calls,
            "attempts": s.attempts,
            "retries": s.retries,
            "throttled_locally": s.throttled_locally,
        }


POPULATIONS = {p.name: p for p in (Naive, Fixed, Sdk, OpenAIPlain, OpenAIOldHeaders)}
MIXED_POPULATIONS = {p.name: p for p in (SdkNoDeadline, OpenAIDefaults, OpenAIOverSdk)}
