"""Idempotency keys: scoping, fingerprints, the record state machine, decisions.

Theory of operation: a request that carries `idempotency-key` is identified by a
*scope* and a *fingerprint*. The scope, a hash of (tenant, method, path, key), names
the record in the store; the tenant is the `x-tenant` header only where the policy
trusts it, else a hash of `authorization`, so one client can never be handed
another's response. The fingerprint hashes what must not change between retries
(query string, the headers the policy names, the body); the same scope with
another fingerprint is a reused key (422).

A record goes absent -> in flight (one leader claimed it) -> complete (its
response is stored for replay) and back to absent on release, lease lapse, TTL
expiry or eviction: `TRANSITIONS`, a `(state, event) -> state` table where an
unknown pair is a bug and raises. `decide()` turns the record found for a scope
into a value: `Lead`, `Follow`, `Replay`, `Mismatch` or `InFlightConflict`.
`settle()` turns how a leader finished into STORE or RELEASE: only complete
exchanges whose status is deterministic (below 500, not 408/425/429) and whose
size fits are stored, so a failure is never replayed and a retry re-executes.

Subscribers (coalesced followers, replays) read `Head`, `Chunk`, `Trailers` if any, then exactly one
terminal `End` or `Failed`. Raw keys never leave this module: logs and metrics
use `short()` of the scope, itself a hash.

Pure: no clock, no I/O. Hashing is blake2b (stdlib, faster than sha256 on bodies).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from hashlib import blake2b

import msgspec

from proxy.core.wire import IDEMPOTENT_REPLAYED, Reason
from proxy.errors import RampmeterError

ANONYMOUS = "anonymous"
# Upstream 4xx that say "try again" rather than "this request is wrong": never stored.
TRANSIENT_4XX = frozenset({408, 425, 429})
REPLAYED_HEADER = (IDEMPOTENT_REPLAYED.encode(), b"true")


# --- key scoping and fingerprints ---------------------------------------------------


def _digest(*parts: bytes) -> str:
    """Hash of length-prefixed parts, so ("ab", "c") and ("a", "bc") differ."""
    h = blake2b(digest_size=20)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def tenant_of(tenant_header: bytes | None, authorization: bytes | None, trust_tenant_header: bool) -> str:
    """Who owns a key. Untrusted `x-tenant` is ignored: anyone could claim anyone's."""
    if trust_tenant_header and tenant_header:
        return "t:" + tenant_header.decode("latin-1")
    if authorization:
        return "a:" + _digest(authorization)
    return ANONYMOUS


def scope_key(tenant: str, method: bytes, path: bytes, key: bytes) -> str:
    """The store's name for a key: hex, fixed length, reveals nothing of the key."""
    return _digest(tenant.encode("latin-1"), method, path, key)


def fingerprint(body: bytes, query: bytes = b"", header_values: tuple[bytes | None, ...] = ()) -> str:
    """What a retry must repeat exactly; a missing header differs from an empty one."""
    parts = [query, body]
    for value in header_values:
        parts.append(b"\x00" if value is None else b"\x01" + value)
    return _digest(*parts)


def short(scope: str) -> str:
    """For logs: enough to correlate lines, too little to matter."""
    return scope[:12]


# --- responses and what subscribers read --------------------------------------------


class Stored(msgspec.Struct, frozen=True, array_like=True):
    """A completed response kept for replay; `chunks` keeps a stream's framing."""

    fingerprint: str
    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: list[bytes]
    streamed: bool = False
    # The response's trailer fields (gRPC: grpc-status); last, with a default, so records
    # stored before trailers were kept still decode.
    trailers: list[tuple[bytes, bytes]] = msgspec.field(default_factory=list)

    @property
    def size(self) -> int:
        fields = [*self.headers, *self.trailers]
        return sum(map(len, self.chunks)) + sum(len(k) + len(v) for k, v in fields)


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    headers: list[tuple[bytes, bytes]]
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes


@dataclass(frozen=True, slots=True)
class Trailers:
    """The trailer fields that end a streamed response (then End)."""

    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class End:
    """The response is complete."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The leader's exchange failed: answer `reason` if nothing was sent, else abort."""

    reason: Reason
    message: str


END = End()
Event = Head | Chunk | Trailers | End | Failed


def replayed(head: Head) -> Head:
    """The head a follower or replay sends: marked so the client knows it did not run."""
    return Head(head.status, [*head.headers, REPLAYED_HEADER], head.streamed)


def replay_events(stored: Stored) -> list[Event]:
    head = replayed(Head(stored.status, stored.headers, stored.streamed))
    tail: list[Event] = [Trailers(stored.trailers)] if stored.trailers else []
    return [head, *(Chunk(c) for c in stored.chunks), *tail, END]


# --- the record state machine --------------------------------------------------------


class State(enum.Enum):
    ABSENT = "absent"
    IN_FLIGHT = "in_flight"
    COMPLETE = "complete"


class Step(enum.Enum):
    CLAIM = "claim"  # a leader took the key
    STORE = "store"  # the leader finished with a storable response
    RELEASE = "release"  # the leader failed, was cancelled or its response is not storable
    LAPSE = "lapse"  # the leader's lease ran out (its replica died)
    EXPIRE = "expire"  # the stored response outlived its TTL
    EVICT = "evict"  # the memory cap pushed the least recently used response out


TRANSITIONS: dict[tuple[State, Step], State] = {
    (State.ABSENT, Step.CLAIM): State.IN_FLIGHT,
    (State.IN_FLIGHT, Step.STORE): State.COMPLETE,
    (State.IN_FLIGHT, Step.RELEASE): State.ABSENT,
    (State.IN_FLIGHT, Step.LAPSE): State.ABSENT,
    (State.COMPLETE, Step.EXPIRE): State.ABSENT,
    (State.COMPLETE, Step.EVICT): State.ABSENT,
}


class DedupStateError(RampmeterError):
    """A transition the table does not allow: a bug, never a client's fault."""


def advance(state: State, step: Step) -> State:
    try:
        return TRANSITIONS[state, step]
    except KeyError:
        raise DedupStateError(f"idempotency record: no transition from {state.value} on {step.value}") from None


@dataclass(frozen=True, slots=True)
class Record:
    """What the store holds for a scope. `owner` is the leader's claim token."""

    state: State
    fingerprint: str
    owner: str = ""
    stored: Stored | None = None


# --- decisions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lead:
    """No live record: claim the key and execute."""


@dataclass(frozen=True, slots=True)
class Follow:
    """A leader is executing the same request: wait for its response."""

    owner: str


@dataclass(frozen=True, slots=True)
class Replay:
    stored: Stored


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Same key, another payload: 422 idempotency_key_reused."""


@dataclass(frozen=True, slots=True)
class InFlightConflict:
    """Same request in flight and the policy (or an overflowed buffer) forbids waiting: 409."""


Decision = Lead | Follow | Replay | Mismatch | InFlightConflict


def decide(record: Record | None, fp: str, on_in_flight: str) -> Decision:
    """What to do with a request whose scope holds `record` (None: nothing)."""
    if record is None or record.state is State.ABSENT:
        return Lead()
    if record.fingerprint != fp:
        return Mismatch()
    if record.state is State.COMPLETE:
        assert record.stored is not None, "a complete record holds its response"
        return Replay(record.stored)
    return Follow(record.owner) if on_in_flight == "coalesce" else InFlightConflict()


class Verdict(enum.Enum):
    STORED = "stored"
    FAILED = "failed"  # the exchange broke or was cancelled: followers get Failed
    NOT_STORABLE = "not_storable"  # complete, but 5xx or transient 4xx
    TOO_LARGE = "too_large"  # complete, but over max_entry_bytes: coalesced, not replayed


def is_storable(status: int) -> bool:
    return 100 <= status < 500 and status not in TRANSIENT_4XX


def settle(ok: bool, status: int | None, size: int, max_entry_bytes: int, overflowed: bool) -> Verdict:
    """How a leader's finish ends its record: only `STORED` takes the STORE step."""
    if not ok or status is None:
        return Verdict.FAILED
    if not is_storable(status):
        return Verdict.NOT_STORABLE
    if overflowed or size > max_entry_bytes:
        return Verdict.TOO_LARGE
    return Verdict.STORED
