"""client_sdk: the rampmeter client SDK for app teams.

Theory of operation: instead of hand-rolled retries, an app sends through a
`Client` / `AsyncClient` (thin over httpx) or plugs a `ResilientTransport` /
`AsyncResilientTransport` into any httpx-based client (the OpenAI SDK
included). A call then retries only when that is safe, with exponential
backoff and full jitter above the server's Retry-After, inside its total
deadline, paid for from a per-host retry budget, and is refused locally while
the server keeps rejecting (adaptive throttling), so a slow pod is helped to
recover rather than buried by a retry storm. Works with or without the
rampmeter sidecar in front; with it, the SDK reads its reasons and hints.

Imports neither the sidecar (`proxy`), trio nor h2, and needs only httpx,
tenacity and anyio: `pip install rampmeter` (tests/client_sdk/test_install.py
checks both). See docs/client-sdk.md.
"""

from client_sdk.backoff import Backoff
from client_sdk.budget import RetryBudget
from client_sdk.client import AsyncClient, Client
from client_sdk.config import CallOptions, RetryConfig
from client_sdk.engine import ClientStatistics, Engine
from client_sdk.errors import (
    ConnectFailed,
    DeadlineExceeded,
    DeadlineUnmeetable,
    Overloaded,
    RampmeterClientError,
    Rejected,
    RetryBudgetExhausted,
    ThrottledLocally,
    TimedOut,
    TransportFailed,
)
from client_sdk.events import AttemptInfo, CallSummary, Hooks, LoggingHooks, RetryInfo, Stop
from client_sdk.hosts import HostStatistics
from client_sdk.throttle import AdaptiveThrottle
from client_sdk.transport import AsyncResilientTransport, ResilientTransport

__all__ = [
    "AdaptiveThrottle",
    "AsyncClient",
    "AsyncResilientTransport",
    "AttemptInfo",
    "Backoff",
    "CallOptions",
    "CallSummary",
    "Client",
    "ClientStatistics",
    "ConnectFailed",
    "DeadlineExceeded",
    "DeadlineUnmeetable",
    "Engine",
    "Hooks",
    "HostStatistics",
    "LoggingHooks",
    "Overloaded",
    "RampmeterClientError",
    "Rejected",
    "ResilientTransport",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryConfig",
    "RetryInfo",
    "Stop",
    "ThrottledLocally",
    "TimedOut",
    "TransportFailed",
]
