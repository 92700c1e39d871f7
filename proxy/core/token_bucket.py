"""Per-tenant token buckets (429 tenant_quota), in a bounded LRU table.

Theory of operation: each bucket is kept as GCRA (the generic cell rate algorithm), an
exact token bucket stored as one number, the theoretical arrival time `tat`: the
moment the bucket would be full again. With T = 1 / rate_per_s seconds per token and a
capacity of `burst` tokens, the tokens available at `now` are
burst - (max(tat, now) - now) / T; taking `cost` tokens moves tat to
max(tat, now) + cost * T and is allowed iff that lands no further than burst * T past
now. A denied request is told exactly how long until enough tokens have refilled. The
arithmetic is only +, -, *, / and max, so with `fractions.Fraction` inputs it is exact,
which is how the tests check "refills exactly"; with floats it is exact up to rounding.

Any bucket with tat <= now is full, i.e. indistinguishable from no entry: `TenantQuota`
therefore evicts the least recently used tenant when `max_tenants` is reached (memory is
bounded whatever tenant ids arrive); only a tenant idle long enough to be the oldest
entry loses its debt, and an idle tenant has usually refilled anyway.

`refund` gives tokens back when a later rule rejected the request anyway, so a request
shed for overload does not also spend its tenant's quota.

Tenant identity (`tenant_key`): the `x-tenant` header when the policy trusts it, else a
hash of `Authorization` (the credential itself is never kept), else one shared
"anonymous" tenant, so leaving both headers off is no way around the quota.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

ANONYMOUS = b"anonymous"
_MAX_RAW_TENANT = 64  # longer x-tenant values are hashed so keys stay small


class TokenBucket:
    __slots__ = ("_burst_s", "_per_token_s", "_tat")

    def __init__(self, rate_per_s: float, burst: float) -> None:
        if not (rate_per_s > 0 and burst >= 1):
            raise ValueError("need rate_per_s > 0 and burst >= 1")
        self._per_token_s = 1 / rate_per_s
        self._burst_s = burst * self._per_token_s
        self._tat: float = -math.inf  # starts full

    def take(self, now: float, cost: float = 1) -> float:
        """0 if `cost` tokens were taken, else seconds until they would be there (inf: never)."""
        need_s = cost * self._per_token_s
        if need_s > self._burst_s:
            return math.inf
        new_tat = max(self._tat, now) + need_s
        over_s = new_tat - now - self._burst_s
        if over_s <= 0:
            self._tat = new_tat
            return 0
        return over_s

    def refund(self, cost: float = 1) -> None:
        """Undo a granted `take(now, cost)` (same cost), e.g. when a later rule rejected."""
        self._tat -= cost * self._per_token_s

    def tokens(self, now: float) -> float:
        return (self._burst_s - (max(self._tat, now) - now)) / self._per_token_s

    def __repr__(self) -> str:
        return f"TokenBucket(rate_per_s={1 / self._per_token_s:g}, burst={self._burst_s / self._per_token_s:g})"


def tenant_key(x_tenant: bytes | None, authorization: bytes | None, *, trust_x_tenant: bool) -> bytes:
    """The key a request's quota is charged to."""
    if trust_x_tenant and x_tenant:
        if len(x_tenant) <= _MAX_RAW_TENANT:
            return b"t:" + x_tenant
        return b"t#" + hashlib.blake2b(x_tenant, digest_size=16).digest()
    if authorization:
        return b"a#" + hashlib.blake2b(authorization, digest_size=16).digest()
    return ANONYMOUS


@dataclass(frozen=True, slots=True)
class TenantQuotaStatistics:
    tenants: int
    max_tenants: int
    granted: int
    denied: int
    evictions: int


class TenantQuota:
    """One `TokenBucket` per tenant key, at most `max_tenants`, least recently used evicted."""

    def __init__(self, rate_per_s: float, burst: float, max_tenants: int) -> None:
        if max_tenants < 1:
            raise ValueError("need max_tenants >= 1")
        TokenBucket(rate_per_s, burst)  # validate once, here rather than on first use
        self.rate_per_s, self.burst, self.max_tenants = rate_per_s, burst, max_tenants
        self._buckets: dict[bytes, TokenBucket] = {}  # insertion order = recency
        self._granted = self._denied = self._evictions = 0

    def take(self, key: bytes, now: float, cost: float = 1) -> float:
        """0 if granted, else seconds until the tenant's tokens would cover `cost`."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate_per_s, self.burst)
            if len(self._buckets) >= self.max_tenants:
                del self._buckets[next(iter(self._buckets))]
                self._evictions += 1
        self._buckets[key] = bucket
        wait_s = bucket.take(now, cost)
        if wait_s:
            self._denied += 1
        else:
            self._granted += 1
        return wait_s

    def refund(self, key: bytes, cost: float = 1) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None:  # evicted in between: it is full again anyway
            bucket.refund(cost)
            self._granted -= 1

    def tokens(self, key: bytes, now: float) -> float:
        bucket = self._buckets.get(key)
        return self.burst if bucket is None else bucket.tokens(now)

    def __len__(self) -> int:
        return len(self._buckets)

    def statistics(self) -> TenantQuotaStatistics:
        return TenantQuotaStatistics(len(self._buckets), self.max_tenants, self._granted, self._denied, self._evictions)

    def __repr__(self) -> str:
        return (
            f"TenantQuota(rate_per_s={self.rate_per_s:g}, burst={self.burst:g}, "
            f"tenants={len(self._buckets)}/{self.max_tenants})"
        )
