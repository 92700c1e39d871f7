"""Policy for idempotent dedup: `[dedup]`, one upstream execution per Idempotency-Key.

Theory of operation: one table, composed into `proxy.policy.schema.Policy` as
`dedup`. The store is in memory (one replica) or Redis (replicas behind one
Service share claims and results). Semantics for app teams are in
docs/idempotency.md; cross-field rules are in `check_dedup` (`@cross_check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from proxy.policy.base import Section, cross_check

# redis[s]://[[USER]:PASSWORD@]HOST[:PORT][/DB]: what coredis' from_url takes for one server.
REDIS_URL_RE = r"^rediss?://([^@/\s]*@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(:[0-9]{1,5})?(/[0-9]{1,2})?$"

if TYPE_CHECKING:
    from proxy.policy.schema import Policy

HeaderName = Annotated[str, Meta(pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$", description="A lower-case header name.")]


class Dedup(Section, frozen=True):
    """Idempotency-Key handling: coalesce concurrent duplicates, replay completed ones."""

    enabled: Annotated[
        bool, Meta(description="Honour the idempotency-key header. Off: the header is forwarded and ignored.")
    ] = True
    store: Annotated[
        Literal["memory", "redis"],
        Meta(
            description="memory: this replica only. redis: claims and results shared by every replica using the same redis_url and key_prefix."
        ),
    ] = "memory"
    redis_url: Annotated[
        str,
        Meta(
            pattern=REDIS_URL_RE,
            description='redis://[:PASSWORD@]HOST:PORT/DB, used when store = "redis". A single Redis server (not Cluster).',
        ),
    ] = "redis://127.0.0.1:6379/0"
    key_prefix: Annotated[
        str,
        Meta(
            pattern=r"^[A-Za-z0-9:_.\-]{0,64}$",
            description="Prefix of every Redis key and channel; give each model deployment its own.",
        ),
    ] = "rampmeter:idem:"
    trust_tenant_header: Annotated[
        bool,
        Meta(
            description="Scope keys by the x-tenant header. Only when a trusted gateway sets it; otherwise keys are scoped by a hash of Authorization."
        ),
    ] = False
    fingerprint_headers: Annotated[
        list[HeaderName],
        Meta(
            max_length=32,
            description="Request headers that, with the query string and body, must match for a retry to count as the same request.",
        ),
    ] = msgspec.field(default_factory=list)
    on_in_flight: Annotated[
        Literal["coalesce", "conflict"],
        Meta(
            description="A duplicate arriving while the first is running: coalesce (wait for and share its response) or conflict (409 idempotency_key_in_flight)."
        ),
    ] = "coalesce"
    on_store_error: Annotated[
        Literal["fail_open", "fail_closed"],
        Meta(
            description="Redis unreachable: fail_open serves without cross-replica dedup; fail_closed answers 503 idempotency_store_unavailable."
        ),
    ] = "fail_open"
    continue_on_disconnect: Annotated[
        bool,
        Meta(
            description="Keep a keyed request's upstream work going when its client disconnects, so the client's retry attaches to it."
        ),
    ] = True
    ttl_s: Annotated[float, Meta(ge=1, le=604_800, description="How long a completed response is replayed.")] = 3600.0
    max_entry_bytes: Annotated[
        int,
        Meta(
            ge=0,
            le=1_073_741_824,
            description="Largest response kept for replay (body and headers); larger ones are only coalesced while running.",
        ),
    ] = 1_048_576
    max_memory_bytes: Annotated[
        int,
        Meta(
            ge=0,
            le=68_719_476_736,
            description="Memory this replica spends on completed responses kept for replay (the memory store, or with redis its replay cache), counted as the memory they really hold: their Python objects and table slots, about 2-4x the response bytes for small or streamed answers. 0 keeps none; the least recently used go first.",
        ),
    ] = 67_108_864
    lease_ms: Annotated[
        int,
        Meta(
            ge=100,
            le=600_000,
            description="A leader's claim lapses this long after its replica stops refreshing it (a crash), freeing the key.",
        ),
    ] = 10_000
    store_timeout_ms: Annotated[
        int, Meta(ge=1, le=60_000, description="Longest wait for one store operation; slower counts as a store error.")
    ] = 250
    store_retry_ms: Annotated[
        int,
        Meta(
            ge=0,
            le=600_000,
            description="After a store error, requests skip the store this long (on_store_error applies) instead of each waiting for it.",
        ),
    ] = 1000


@cross_check
def check_dedup(policy: Policy) -> list[str]:
    d = getattr(policy, "dedup", None)
    if d is None:
        return []
    problems = []
    if d.store == "memory" and d.max_entry_bytes > d.max_memory_bytes:
        problems.append("dedup.max_entry_bytes: larger than dedup.max_memory_bytes, so nothing that size could be kept")
    if d.lease_ms < 4 * d.store_timeout_ms:
        problems.append(
            "dedup.lease_ms: must be at least 4 x dedup.store_timeout_ms, or a slow refresh lets a live claim lapse"
        )
    return problems
