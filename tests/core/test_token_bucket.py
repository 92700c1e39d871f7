"""Token buckets refill exactly (checked with Fractions against a plain bucket), tenant table is bounded."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.token_bucket import ANONYMOUS, TenantQuota, TokenBucket, tenant_key


def test_starts_full_then_refills_one_token_per_interval_exactly():
    bucket = TokenBucket(rate_per_s=Fraction(10), burst=3)
    assert [bucket.take(Fraction(0)) for _ in range(3)] == [0, 0, 0]
    assert bucket.take(Fraction(0)) == Fraction(1, 10)  # denied: exactly one token interval away
    assert bucket.tokens(Fraction(1, 20)) == Fraction(1, 2)
    assert bucket.take(Fraction(1, 10)) == 0
    assert bucket.tokens(Fraction(1, 10)) == 0
    assert bucket.tokens(Fraction(100)) == 3  # never above burst


class PlainBucket:
    """The textbook bucket: tokens refill at `rate`, capped at `burst`."""

    def __init__(self, rate: Fraction, burst: int) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, Fraction(burst), Fraction(0)

    def take(self, now: Fraction, cost: int) -> Fraction:
        self.tokens = min(Fraction(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if cost > self.burst:
            return math.inf
        if self.tokens >= cost:
            self.tokens -= cost
            return Fraction(0)
        return (cost - self.tokens) / self.rate


@given(
    st.fractions(min_value=Fraction(1, 10), max_value=1000, max_denominator=100),
    st.integers(min_value=1, max_value=20),
    st.lists(
        st.tuples(st.fractions(min_value=0, max_value=2, max_denominator=1000), st.integers(min_value=1, max_value=25)),
        max_size=60,
    ),
)
def test_refills_exactly_like_a_plain_token_bucket(rate, burst, steps):
    gcra, plain = TokenBucket(rate, burst), PlainBucket(rate, burst)
    now = Fraction(0)
    for dt, cost in steps:
        now += dt
        assert gcra.take(now, cost) == plain.take(now, cost)
        assert gcra.tokens(now) == plain.tokens


def test_a_cost_above_burst_is_never_granted():
    assert TokenBucket(5, 2).take(0.0, cost=3) == math.inf


def test_refund_undoes_a_take():
    bucket = TokenBucket(Fraction(2), 4)
    bucket.take(Fraction(0), 3)
    bucket.refund(3)
    assert bucket.tokens(Fraction(0)) == 4
    bucket.take(Fraction(0), 4)
    bucket.take(Fraction(1), 1)  # 2 refilled, 1 taken
    bucket.refund(1)
    assert bucket.tokens(Fraction(1)) == 2


def test_validation_and_repr():
    with pytest.raises(ValueError):
        TokenBucket(0, 1)
    with pytest.raises(ValueError):
        TenantQuota(1, 0, 10)
    assert repr(TokenBucket(5, 10)) == "TokenBucket(rate_per_s=5, burst=10)"


def test_tenants_have_separate_buckets():
    quota = TenantQuota(rate_per_s=1, burst=1, max_tenants=10)
    assert quota.take(b"a", 0.0) == 0
    assert quota.take(b"a", 0.0) == pytest.approx(1.0)
    assert quota.take(b"b", 0.0) == 0
    stats = quota.statistics()
    assert (stats.tenants, stats.granted, stats.denied) == (2, 2, 1)


def test_tenant_table_is_bounded_and_forgets_the_least_recently_seen():
    quota = TenantQuota(rate_per_s=1, burst=1, max_tenants=2)
    quota.take(b"a", 0.0)
    quota.take(b"b", 0.0)
    quota.take(b"a", 0.0)  # a seen again: b is now the oldest
    quota.take(b"c", 0.0)
    assert len(quota) == 2
    assert quota.tokens(b"b", 0.0) == 1  # forgotten, so full again
    assert quota.tokens(b"a", 0.0) == 0
    assert quota.statistics().evictions == 1
    for i in range(1000):
        quota.take(str(i).encode(), 1.0)
    assert len(quota) == 2


def test_refund_of_a_forgotten_tenant_is_harmless():
    quota = TenantQuota(rate_per_s=1, burst=1, max_tenants=1)
    quota.take(b"a", 0.0)
    quota.take(b"b", 0.0)
    quota.refund(b"a")
    assert quota.tokens(b"a", 0.0) == 1


def test_tenant_key_trusts_x_tenant_only_when_told():
    assert tenant_key(b"acme", b"Bearer s3cret", trust_x_tenant=True) == b"t:acme"
    hashed = tenant_key(b"acme", b"Bearer s3cret", trust_x_tenant=False)
    assert hashed.startswith(b"a#") and b"s3cret" not in hashed
    assert hashed == tenant_key(None, b"Bearer s3cret", trust_x_tenant=True)
    assert hashed != tenant_key(None, b"Bearer other", trust_x_tenant=False)
    assert tenant_key(None, None, trust_x_tenant=True) == ANONYMOUS
    assert tenant_key(b"", b"", trust_x_tenant=True) == ANONYMOUS
    assert len(tenant_key(b"x" * 10_000, None, trust_x_tenant=True)) <= 20
