"""BucketedRate against DecayedRate per bucket (the figure it promises), rescale included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.rates import BucketedRate, DecayedRate

events = st.lists(
    st.tuples(st.floats(0.0, 5.0), st.integers(0, 7), st.floats(0.0, 1e4)),  # (gap s, bucket, amount)
    max_size=60,
)


@given(events, st.integers(0, 8), st.floats(0.0, 100.0))
def test_rate_below_is_the_sum_of_each_buckets_decayed_rate(evts, below, after_s):
    tau = 2.0  # 60 tau = 120 s: long runs of gaps cross a rescale
    bucketed = BucketedRate(tau, 8, 0.0)
    each = [DecayedRate(tau) for _ in range(8)]
    now = 0.0
    for gap, bucket, amount in evts:
        now += gap
        bucketed.add(now, bucket, amount)
        each[bucket].add(now, amount)
    now += after_s
    expected = sum(r.rate(now) for r in each[:below])
    assert bucketed.rate_below(now, below) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_an_empty_rate_reads_zero_and_a_steady_one_reads_its_rate():
    r = BucketedRate(1.0, 4, 0.0)
    assert r.rate_below(10.0, 4) == 0.0
    for i in range(2000):  # 50 ms of work in bucket 1 every 10 ms: 5,000 ms/s
        r.add(i / 100.0, 1, 50.0)
    assert r.rate_below(20.0, 2) == pytest.approx(5000.0, rel=0.01)
    assert r.rate_below(20.0, 1) == 0.0
    assert "buckets=4" in repr(r)
