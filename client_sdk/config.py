"""Client-wide settings (`RetryConfig`) and per-call options (`CallOptions`).

Theory of operation: `RetryConfig` is fixed when a client or transport is built
and holds the defaults app teams should rarely touch; each is documented on the
field and in docs/client-sdk.md. `CallOptions` travel with one request inside
`request.extensions["rampmeter"]` (httpx passes request extensions through to
the transport untouched), so the same transport serves `client_sdk.Client`,
a plain `httpx.Client` and the OpenAI SDK. Callers that cannot set extensions
(the OpenAI SDK) can set the same things as headers: `x-priority`,
`x-cost-hint`, `x-tenant`, `idempotency-key`, and `x-request-timeout-ms`, which
the SDK then reads as the call's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from client_sdk import wire

# The key under which CallOptions ride in request.extensions, and the call
# summary in response.extensions.
EXTENSION = "rampmeter"


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """How a client retries, budgets and throttles. Every default is for app teams."""

    max_attempts: int = 3
    """Attempts per call, the first included (3: at most two retries)."""
    backoff_base_s: float = 0.1
    """Jitter ceiling before the first retry (100 ms); grows by `backoff_multiplier`."""
    backoff_cap_s: float = 5.0
    """Largest jitter ceiling (5 s)."""
    backoff_multiplier: float = 2.0
    """Growth of the ceiling per retry (2: 100 ms, 200 ms, 400 ms, ...)."""
    max_wait_s: float = 30.0
    """A server asking for a longer wait (Retry-After) ends the call instead (30 s)."""
    budget_ratio: float = 0.1
    """Retry tokens earned per call, per host (0.1: one retry per ten calls)."""
    budget_floor_per_s: float = 10.0
    """Retry tokens earned per second regardless of traffic, per host (10/s)."""
    budget_max_tokens: float = 10.0
    """Most retry tokens a host's bucket holds: the largest burst of retries (10)."""
    throttle_k: float = 2.0
    """SRE adaptive-throttle K (2): refuse locally once rejections pass 1 - 1/K of calls."""
    throttle_window_s: float = 60.0
    """Sliding window of the adaptive throttle (60 s)."""
    throttle_min_requests: int = 20
    """The throttle refuses nothing until this many attempts were sent in its window (20)."""
    throttle_max_probability: float = 0.9
    """The most calls the throttle refuses (0.9): one in ten still tests the server."""
    deadline_s: float | None = None
    """Default total deadline per call, retries and waits included (None: none)."""
    auto_idempotency_key: bool = True
    """Add an `idempotency-key` to non-idempotent requests (POST, PATCH) (True)."""

    def __post_init__(self) -> None:
        problems = []
        if self.max_attempts < 1:
            problems.append("max_attempts >= 1")
        if self.backoff_base_s < 0 or self.backoff_cap_s < 0 or self.backoff_multiplier < 1:
            problems.append("backoff_base_s >= 0, backoff_cap_s >= 0, backoff_multiplier >= 1")
        if self.max_wait_s < 0:
            problems.append("max_wait_s >= 0")
        if self.budget_ratio < 0 or self.budget_floor_per_s < 0 or self.budget_max_tokens < 1:
            problems.append("budget_ratio >= 0, budget_floor_per_s >= 0, budget_max_tokens >= 1")
        if self.throttle_k < 1 or self.throttle_window_s <= 0:
            problems.append("throttle_k >= 1, throttle_window_s > 0")
        if self.throttle_min_requests < 0 or not 0 <= self.throttle_max_probability <= 1:
            problems.append("throttle_min_requests >= 0, 0 <= throttle_max_probability <= 1")
        if self.deadline_s is not None and self.deadline_s <= 0:
            problems.append("deadline_s > 0 or None")
        if problems:
            raise ValueError("RetryConfig needs " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Per-call options. None means "not set": the client default or no header."""

    deadline_s: float | None = None
    """Total budget for this call, retries included; overrides RetryConfig.deadline_s."""
    priority: str | None = None
    """`x-priority`: a class the sidecar's policy defines (realtime, interactive, batch)."""
    cost_hint: int | None = None
    """`x-cost-hint`: expected cost in tokens, overriding the sidecar's estimate."""
    tenant: str | None = None
    """`x-tenant`: tenant id, where the sidecar's policy trusts it."""
    idempotency_key: str | bool | None = None
    """A key to send; False: send none (opt out); None: automatic per RetryConfig."""

    def __post_init__(self) -> None:
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError("deadline_s must be > 0")
        if self.cost_hint is not None and self.cost_hint < 0:
            raise ValueError("cost_hint must be >= 0")
        key = self.idempotency_key
        if isinstance(key, str) and not 1 <= len(key) <= wire.MAX_IDEMPOTENCY_KEY_LEN:
            raise ValueError(f"idempotency_key must be 1-{wire.MAX_IDEMPOTENCY_KEY_LEN} characters")

    def headers(self) -> list[tuple[str, str]]:
        """The wire headers these options set (the idempotency key is the engine's)."""
        out = []
        if self.priority is not None:
            out.append((wire.PRIORITY, self.priority))
        if self.cost_hint is not None:
            out.append((wire.COST_HINT, str(self.cost_hint)))
        if self.tenant is not None:
            out.append((wire.TENANT, self.tenant))
        return out

    def extensions(self) -> dict[str, object]:
        """`extensions=` for any httpx request: `client.post(url, extensions=opts.extensions())`."""
        return {EXTENSION: self}


DEFAULT_OPTIONS = CallOptions()
