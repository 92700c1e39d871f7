"""Per-host state: retry budget, adaptive throttle, timeout hints per kind of request.

Theory of operation: a retry storm is a per-destination problem, so everything
the SDK learns about a server is kept per host (`scheme://host:port`): its
retry budget (`client_sdk.budget`), its adaptive throttle
(`client_sdk.throttle`), the `x-rampmeter-timeout-hint-ms` it sent for each kind
of request (`client_sdk.kinds`) and the last capacity failure it answered (for the
throttle's message). A `HostTable` creates entries on first use. It is not
thread-safe by itself: the engine calls it under its one lock, which is never held
across I/O or an await.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from client_sdk.budget import RetryBudget
from client_sdk.config import RetryConfig
from client_sdk.kinds import HintTable
from client_sdk.throttle import AdaptiveThrottle, Admission


def host_key(url: httpx.URL) -> str:
    """`scheme://host:port` with the scheme's default port filled in."""
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{url.host}:{port}"


@dataclass(frozen=True, slots=True)
class HostStatistics:
    budget_tokens: float
    budget_granted: int
    budget_refused: int
    throttle_probability: float
    window_requests: int
    window_accepts: int
    refused_locally: int
    timeout_hints: dict[str, float]  # kind of request ("POST /v1/chat/completions#9") -> hint, seconds
    last_failure: str | None  # the last capacity failure: a sidecar reason, a status or an error name


class HostState:
    __slots__ = ("budget", "hints", "last_failure", "throttle")

    def __init__(self, config: RetryConfig) -> None:
        self.budget = RetryBudget(config.budget_ratio, config.budget_floor_per_s, config.budget_max_tokens)
        self.throttle = AdaptiveThrottle(
            config.throttle_k,
            config.throttle_window_s,
            min_requests=config.throttle_min_requests,
            max_probability=config.throttle_max_probability,
        )
        self.hints = HintTable()
        self.last_failure: str | None = None

    def statistics(self, now: float) -> HostStatistics:
        budget = self.budget.statistics(now)
        throttle = self.throttle.statistics(now)
        return HostStatistics(
            budget_tokens=budget.tokens,
            budget_granted=budget.withdrawals,
            budget_refused=budget.refusals,
            throttle_probability=throttle.probability,
            window_requests=throttle.requests,
            window_accepts=throttle.accepts,
            refused_locally=throttle.refused,
            timeout_hints=self.hints.snapshot(),
            last_failure=self.last_failure,
        )


class HostTable:
    """host key -> HostState, created on first use."""

    __slots__ = ("_config", "_hosts")

    def __init__(self, config: RetryConfig) -> None:
        self._config = config
        self._hosts: dict[str, HostState] = {}

    def get(self, host: str) -> HostState:
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = HostState(self._config)
        return state

    def admit(self, host: str, now: float, rng: random.Random) -> Admission:
        """Throttle check for a new call; an admitted call earns its budget deposit."""
        state = self.get(host)
        admission = state.throttle.admit(now, rng)
        if admission.admitted:
            state.budget.deposit(now)
        return admission

    def statistics(self, now: float) -> dict[str, HostStatistics]:
        return {host: state.statistics(now) for host, state in self._hosts.items()}

    def __len__(self) -> int:
        return len(self._hosts)
