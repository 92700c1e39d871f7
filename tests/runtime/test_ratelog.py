"""RateLimitedLog: the first lines of a burst, then per_s a second, and a count of the rest."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from proxy.http.ratelog import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_logs_its_first_lines_then_counts_the_rest(caplog):
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("t.rl"), per_s=1.0, burst=3, clock=clock)
    with caplog.at_level(logging.WARNING, "t.rl"):
        logged = [rl.event("flood", "flood from %s", "1.2.3.4") for _ in range(100)]
    assert logged == [True] * 3 + [False] * 97
    assert rl.statistics() == {"flood": 97}
    clock.now = 1.0
    with caplog.at_level(logging.WARNING, "t.rl"):
        assert rl.event("flood", "flood from %s", "1.2.3.4")
    assert caplog.messages[-1] == "flood from 1.2.3.4 (97 more flood events suppressed)"
    assert rl.statistics() == {"flood": 0}


def test_kinds_have_separate_budgets():
    rl = RateLimitedLog(logging.getLogger("t.rl2"), per_s=1.0, burst=1, clock=Clock())
    assert rl.event("a", "a")
    assert not rl.event("a", "a")
    assert rl.event("b", "b")


@given(st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=300))
def test_never_more_lines_than_burst_plus_rate_times_elapsed(gaps):
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("t.rl3"), per_s=2.0, burst=4, clock=clock)
    lines = 0
    for gap in gaps:
        clock.now += gap
        lines += rl.event("k", "x")
    assert lines <= 4 + 2.0 * clock.now + 1e-9
