"""Policy for dynamic micro-batching: `[batching]` and its `[[batching.routes]]`.

Theory of operation: each route names one exact request path whose bodies the
sidecar may merge (proxy/core/batch_bodies.py knows the shapes: OpenAI
embeddings, a `{query, documents}` rerank, KServe v2 infer with a batch
dimension) and the bounds of a batch (proxy/core/batching.py forms them,
proxy/runtime/batcher.py sends them). No route: nothing is batched, and the
request path costs one dict lookup more. Semantics and tuning are in
docs/batching.md; cross-field rules are in `check_batching` (`@cross_check`).

"Tokens" are estimated input tokens (characters / chars_per_token, or the length
of a token-id list); for kserve_v2 they are tensor elements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from proxy.policy.base import Section, cross_check

if TYPE_CHECKING:
    from proxy.policy.schema import Policy

HeaderName = Annotated[str, Meta(pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$", description="A lower-case header name.")]
BucketEdge = Annotated[int, Meta(ge=1, le=10_000_000)]


class BatchRoute(Section, frozen=True):
    """One batchable path: its body shape and the bounds of a batch."""

    path: Annotated[
        str,
        Meta(
            pattern=r"^/[^?#\s]*$",
            max_length=512,
            description="Exact request path (no query), e.g. /v1/embeddings or /v2/models/encoder/infer.",
        ),
    ]
    kind: Annotated[
        Literal["embeddings", "rerank", "kserve_v2"],
        Meta(
            description="Body shape: embeddings (OpenAI `input`: a string or a list), rerank (`query` + `documents`; only equal queries share a call), kserve_v2 (v2 infer whose every input has the batch dimension first)."
        ),
    ] = "embeddings"
    max_batch_items: Annotated[
        int,
        Meta(ge=1, le=65_536, description="Most inputs (rows) in one upstream call; a batch reaching it is sent."),
    ] = 32
    max_batch_tokens: Annotated[
        int,
        Meta(
            ge=1,
            le=100_000_000,
            description="Most estimated input tokens in one upstream call; a batch reaching it is sent. A request larger than either bound goes alone, unbatched.",
        ),
    ] = 16_384
    max_wait_ms: Annotated[
        float,
        Meta(
            ge=0,
            le=60_000,
            description="A batch is sent when its oldest member has waited this long (or sooner: full, or a member's deadline). 0: send at once whatever has gathered while the upstream was busy.",
        ),
    ] = 10.0
    adaptive: Annotated[
        bool,
        Meta(
            description="Choose size and window from the observed latency curve: the batch size where throughput per unit of latency peaks (the knee), and a window no longer than the expected time to fill it; max_batch_items, max_batch_tokens and max_wait_ms stay upper bounds."
        ),
    ] = False
    length_buckets: Annotated[
        list[BucketEdge],
        Meta(
            max_length=16,
            description="Token edges of the length buckets, increasing; only requests whose longest input falls in the same bucket share a call, so one long input does not pad a batch of short ones. []: one bucket.",
        ),
    ] = msgspec.field(default_factory=lambda: [64, 256])
    max_concurrent_batches: Annotated[
        int,
        Meta(
            ge=1,
            le=1024,
            description="Batches of this route in flight per upstream at once; others keep gathering members until one returns. 1 suits a server that runs one call at a time or pads concurrent calls together.",
        ),
    ] = 1
    on_batch_error: Annotated[
        Literal["fail_all", "split"],
        Meta(
            description="A batch the upstream fails (4xx other than 429, or 5xx other than 503) without saying which input: fail_all gives every member the answer; split retries it once as two halves, so a bad input fails only its half."
        ),
    ] = "fail_all"
    chars_per_token: Annotated[
        float, Meta(gt=0, le=100, description="Characters per token when estimating an input's length.")
    ] = 4.0
    match_headers: Annotated[
        list[HeaderName],
        Meta(
            max_length=16,
            description="Request headers that must be equal for requests to share a call, and that the call carries (content-type, accept and the tenant always separate too).",
        ),
    ] = msgspec.field(default_factory=lambda: ["authorization"])
    max_response_bytes: Annotated[
        int,
        Meta(
            ge=1024,
            le=1_073_741_824,
            description="Largest batch answer read; a larger one fails the batch (502) rather than filling memory.",
        ),
    ] = 67_108_864


class Batching(Section, frozen=True):
    """Dynamic micro-batching: concurrent requests merged into one upstream call (docs/batching.md)."""

    routes: Annotated[
        list[BatchRoute],
        Meta(max_length=64, description="Batchable paths; none: nothing is batched."),
    ] = msgspec.field(default_factory=list)
    max_open_batches: Annotated[
        int,
        Meta(
            ge=1,
            le=1_000_000,
            description="Batches gathering at once, over every route and upstream; a request that would open one more goes alone (distinct models, parameters and tenants each open their own).",
        ),
    ] = 4096


@cross_check
def check_batching(policy: Policy) -> list[str]:
    """Cross-field rules for `[batching]`; one message per problem, naming its key."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, route in enumerate(policy.batching.routes):
        where = f"batching.routes[{i}]"
        if route.path in seen:
            problems.append(f"{where}.path: {route.path!r} repeats batching.routes[{seen[route.path]}]")
        seen.setdefault(route.path, i)
        edges = route.length_buckets
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            problems.append(f"{where}.length_buckets: edges must increase strictly, got {edges}")
        if len(set(route.match_headers)) != len(route.match_headers):
            problems.append(f"{where}.match_headers: a header is listed twice")
    return problems
