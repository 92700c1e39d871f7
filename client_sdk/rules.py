"""The retry decision table: which outcomes may be sent again.

Theory of operation: a retry is safe only if it cannot make the model server run
a request twice, or if running it twice is harmless. So each `Signal` maps to a
`Rule`:

- ALWAYS: the request provably did not run. A connection that failed before any
  byte was sent; a sidecar rejection whose reason is in `wire.RETRYABLE_REASONS`
  (queue full, not ready, tenant quota, ...: the sidecar never forwarded it).
- IF_SAFE: the request may have run. Retried only for idempotent methods
  (RFC 9110 section 9.2.2) or requests that carry an `idempotency-key`, which the
  sidecar uses to replay instead of re-running. Read timeouts, errors after
  sending, 502/504, and 503/429 from a server that gave no rampmeter reason
  (without the sidecar we cannot know it was not run).
- NEVER: an answer, a final rejection (bad request, key reused), a deadline the
  request's service time alone exceeds (deadline_unmeetable with no Retry-After:
  the remaining budget only shrinks, so no retry can make it), an expired
  deadline, a local failure.

On top of the table, two absolute rules: a request body that cannot be replayed
(a generator upload) is never retried, and a response is judged on its status
line and headers only: once its body is handed to the caller it is the caller's
(the SDK never retries a streamed response that has started).

Budget, deadline and attempt limits are not here: they decide *whether we can
afford* a retry (`client_sdk.engine`), this decides *whether it is safe*.
"""

from __future__ import annotations

import enum

from client_sdk.signals import Signal


class Rule(enum.Enum):
    ALWAYS = "always"
    IF_SAFE = "if_idempotent_or_keyed"
    NEVER = "never"


RULES: dict[Signal, Rule] = {
    Signal.ANSWERED: Rule.NEVER,
    Signal.CONNECT_FAILED: Rule.ALWAYS,
    Signal.READ_TIMEOUT: Rule.IF_SAFE,
    Signal.BROKEN_AFTER_SEND: Rule.IF_SAFE,
    Signal.REJECTED_RETRYABLE: Rule.ALWAYS,
    Signal.REJECTED_BY_CALLER: Rule.ALWAYS,
    Signal.REJECTED_UNMEETABLE: Rule.NEVER,  # the budget only shrinks: no retry can make it
    Signal.REJECTED_FINAL: Rule.NEVER,
    Signal.DEADLINE_EXPIRED: Rule.NEVER,
    Signal.GATEWAY_FAILED: Rule.IF_SAFE,
    Signal.OVERLOAD_UNQUALIFIED: Rule.IF_SAFE,
    Signal.LOCAL_FAILURE: Rule.NEVER,
}

# RFC 9110 section 9.2.2: repeating these has the same effect as sending once.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


def is_idempotent(method: str) -> bool:
    return method.upper() in IDEMPOTENT_METHODS


def may_retry(signal: Signal, *, method: str, keyed: bool, replayable: bool) -> bool:
    """Whether sending this request again is safe after `signal`."""
    if not replayable:
        return False
    rule = RULES[signal]  # KeyError on a new Signal without a rule: a bug, not a default
    if rule is Rule.ALWAYS:
        return True
    if rule is Rule.IF_SAFE:
        return keyed or is_idempotent(method)
    return False
