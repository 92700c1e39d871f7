"""bench.real_servers' load point: the server's open-loop capacity is the answers it gave inside the window.

The same_throughput case offers 0.9 x `saturated_rps` of the direct overload runs; answers that ended
in the warm-up, after the offering stopped (the backlog draining), or that were not 2xx are no capacity.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.real_servers.cases import saturated_rps
from proxy.loadtest.records import Records, StepRun


def step(ends_status: list[tuple[float, int]], warmup_s: float = 2.0, duration_s: float = 10.0) -> StepRun:
    rec = Records()
    for end, status in ends_status:
        i = rec.append(0.0, 0)
        rec.end[i], rec.status[i] = end, status
    return StepRun(0, 20.0, 0.0, duration_s, warmup_s, rec)


def test_counts_only_2xx_answers_inside_the_window() -> None:
    rows = [(1.0, 200), (2.0, 200), (5.0, 200), (9.9, 204), (6.0, 503), (7.0, 0), (10.0, 200), (14.0, 200)]
    # Inside [2, 10): 2.0, 5.0, 9.9 are 2xx; 503 and no-answer are not; 10.0 and 14.0 are the backlog.
    assert saturated_rps([step(rows)]) == 3 / 8


def test_no_window_no_capacity() -> None:
    assert saturated_rps([]) is None
    assert saturated_rps([step([(1.0, 200)], warmup_s=5.0, duration_s=5.0)]) is None


@given(st.lists(st.floats(min_value=0.0, max_value=30.0, allow_nan=False), max_size=200))
def test_never_more_than_the_answers_in_the_window(ends: list[float]) -> None:
    rate = saturated_rps([step([(e, 200) for e in ends])])
    assert rate is not None
    assert rate * 8.0 == sum(1 for e in ends if 2.0 <= e < 10.0)
