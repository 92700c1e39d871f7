"""Batch formation (proxy/core/batching.py) with a hand-advanced clock, and Hypothesis invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.batching import DEADLINE_SAFETY, Batch, BatchFormer, Bounds, LatencyCurve, Member

FREE = 1_000_000  # concurrency that never binds


def former(
    *,
    items: int = 8,
    tokens: int = 10_000,
    wait_ms: float = 10.0,
    buckets: tuple[int, ...] = (),
    concurrent: int = FREE,
    adaptive: bool = False,
    base_ms: float = 20.0,
    ms_per_token: float = 0.02,
) -> BatchFormer:
    bounds = Bounds(items, tokens, wait_ms / 1000.0, buckets, concurrent, adaptive)
    return BatchFormer(bounds, LatencyCurve(base_ms, ms_per_token, scale_tokens=1000))


_ids = iter(range(1, 10**9))


def member(at: float, *, key="m", items: int = 1, tokens: int = 10, longest: int | None = None, deadline=None):
    return Member(next(_ids), key, items, tokens, tokens if longest is None else longest, at, deadline)


def ids(batch: Batch) -> list[int]:
    return [m.id for m in batch.members]


def test_a_batch_reaching_max_items_leaves_at_once_closed_by_size():
    f = former(items=3)
    ms = [member(0.0) for _ in range(3)]
    assert f.add(ms[0], 0.0) == [] and f.add(ms[1], 0.001) == []
    (batch,) = f.add(ms[2], 0.002)
    assert (ids(batch), batch.closed_by, batch.sent_at) == ([m.id for m in ms], "size", 0.002)
    assert f.open_groups == 0 and f.in_flight == 1


def test_a_batch_reaching_max_tokens_leaves_closed_by_tokens():
    f = former(tokens=100)
    assert f.add(member(0.0, tokens=60), 0.0) == []
    (batch,) = f.add(member(0.0, tokens=40), 0.0)
    assert (batch.tokens, batch.closed_by) == (100, "tokens")


def test_a_member_that_would_overflow_starts_the_next_batch():
    f = former(tokens=100)
    first = member(0.0, tokens=60)
    f.add(first, 0.0)
    assert f.add(member(0.0, tokens=50), 0.0) == []  # 110 > 100: a second group
    assert f.open_groups == 2
    assert sorted(len(b.members) for b in f.poll(0.010)) == [1, 1]
    assert f.open_groups == 0


def test_the_oldest_member_waits_exactly_max_wait_then_the_batch_leaves_by_time():
    f = former(wait_ms=10)
    a, b = member(1.0), member(1.004)
    f.add(a, 1.0)
    f.add(b, 1.004)
    assert f.wake_at(1.004) == pytest.approx(1.010)
    assert f.poll(1.0099) == []
    (batch,) = f.poll(1.010)
    assert (ids(batch), batch.closed_by) == ([a.id, b.id], "time")


def test_max_wait_zero_sends_at_once():
    f = former(wait_ms=0)
    (batch,) = f.add(member(0.0), 0.0)
    assert batch.closed_by == "time" and batch.sent_at == 0.0


def test_length_buckets_keep_short_and_long_inputs_apart_and_count_the_padding_saved():
    f = former(items=2, buckets=(64,))
    short1, long1 = member(0.0, tokens=20), member(0.0, tokens=400)
    f.add(short1, 0.0)
    f.add(long1, 0.0)
    assert f.open_groups == 2
    (batch,) = f.add(member(0.0, tokens=30), 0.0)  # the short group is full
    assert short1.id in ids(batch) and long1.id not in ids(batch)
    assert batch.padding_tokens == 30 * 2 - 50
    assert batch.padding_saved_tokens == (400 - 30) * 2  # against one mixed call with the long input


def test_members_of_different_keys_never_share_a_batch():
    f = former(items=2)
    f.add(member(0.0, key=("m1", b"tenant-a")), 0.0)
    assert f.add(member(0.0, key=("m1", b"tenant-b")), 0.0) == []
    (batch,) = f.add(member(0.0, key=("m1", b"tenant-a")), 0.0)
    assert {m.key for m in batch.members} == {("m1", b"tenant-a")}


def test_a_deadline_shorter_than_the_window_sends_at_the_latest_departure():
    f = former(wait_ms=100)  # expected call: 20 + 0.02 * 10 = 20.2 ms
    m = member(0.0, deadline=0.050)
    f.add(m, 0.0)
    latest = 0.050 - DEADLINE_SAFETY * 0.0202
    assert f.wake_at(0.0) == pytest.approx(latest)
    assert f.poll(latest - 1e-6) == []
    (batch,) = f.poll(f.wake_at(0.0))
    assert batch.closed_by == "deadline"


def test_a_member_that_cannot_wait_joins_and_hurries_a_batch_that_can_take_it():
    f = former(wait_ms=100)
    patient = member(0.0)
    f.add(patient, 0.0)
    (batch,) = f.add(member(0.001, deadline=0.010), 0.001)  # cannot absorb any wait: goes first, with company
    assert len(batch.members) == 2 and batch.closed_by == "deadline" and batch.sent_at == 0.001


def test_a_member_that_cannot_wait_goes_alone_when_joining_would_make_another_late():
    f = former(wait_ms=100)
    f.add(member(0.0, tokens=10, deadline=0.055), 0.0)  # latest departure 0.0247 alone, -0.0053 with +1000 tokens
    (batch,) = f.add(member(0.021, tokens=1000, deadline=0.030), 0.021)
    assert len(batch.members) == 1 and batch.members[0].tokens == 1000 and batch.closed_by == "deadline"
    assert f.open_groups == 1


def test_a_due_batch_waits_for_a_free_call_and_takes_members_meanwhile():
    f = former(items=4, wait_ms=5, concurrent=1)
    (first,) = f.add(member(0.0), 0.0) + f.poll(0.005)
    f.add(member(0.006), 0.006)
    assert f.poll(0.011) == [] and f.wake_at(0.011) is None  # due, but the one call is busy
    f.add(member(0.020), 0.020)  # joins the due group while it waits
    (second,) = f.finished(first, 0.030, rtt_ms=30.0)
    assert len(second.members) == 2 and f.in_flight == 1


def test_a_member_leaving_before_the_send_is_taken_out_and_an_empty_batch_disappears():
    f = former(wait_ms=10)
    a, b = member(0.0), member(0.001)
    f.add(a, 0.0)
    f.add(b, 0.001)
    assert f.leave(a.id, 0.002) is True and f.leave(a.id, 0.002) is False
    (batch,) = f.poll(0.011)  # the window now runs from b, the oldest left
    assert ids(batch) == [b.id]
    c = member(0.02)
    f.add(c, 0.02)
    assert f.leave(c.id, 0.021) and f.open_groups == 0 and f.wake_at(0.021) is None


def test_when_a_call_frees_the_shorter_call_goes_first_unless_the_longer_waited_the_difference():
    f = former(items=8, wait_ms=1, concurrent=1, base_ms=10.0, ms_per_token=0.1)
    (running,) = f.add(member(0.0, key="x"), 0.0) + f.poll(0.001)
    long = member(0.002, key="long", tokens=400)  # a 50 ms call
    short = member(0.010, key="short", tokens=10)  # a 11 ms call
    f.add(long, 0.002)
    f.add(short, 0.010)
    (nxt,) = f.finished(running, 0.020)
    assert ids(nxt) == [short.id]  # waited 8 ms less, but its call is 39 ms shorter
    f2 = former(items=8, wait_ms=1, concurrent=1, base_ms=10.0, ms_per_token=0.1)
    (running,) = f2.add(member(0.0, key="x"), 0.0) + f2.poll(0.001)
    long, short = member(0.002, key="long", tokens=400), member(0.050, key="short", tokens=10)
    f2.add(long, 0.002)
    f2.add(short, 0.050)
    (nxt,) = f2.finished(running, 0.060)
    assert ids(nxt) == [long.id]  # it has waited 48 ms longer: more than the 39 ms its call costs extra


def test_urgent_batches_go_first_when_a_call_frees():
    f = former(items=8, wait_ms=50, concurrent=1)
    (running,) = f.add(member(0.0, key="x", deadline=0.001), 0.0)
    f.add(member(0.001, key="old"), 0.001)
    hurried = member(0.002, key="new", deadline=0.030)
    f.add(hurried, 0.002)
    (nxt,) = f.finished(running, 0.060)
    assert ids(nxt) == [hurried.id]


def test_oversized_member_is_refused():
    f = former(items=2)
    with pytest.raises(ValueError):
        f.add(member(0.0, items=3), 0.0)


# --- the latency curve and the adaptive mode ------------------------------------------


def test_the_curve_learns_a_line_and_its_knee_is_overhead_over_slope():
    curve = LatencyCurve(1.0, 1.0, scale_tokens=1000, memory=1000)
    for tokens in (100, 400, 800, 1600, 3200) * 40:
        curve.observe(tokens, 20.0 + 0.02 * tokens)
    a, b = curve.coefficients()
    assert a == pytest.approx(20.0, rel=0.05) and b == pytest.approx(0.02, rel=0.05)
    assert curve.knee_tokens() == pytest.approx(1000, rel=0.1)


def test_without_samples_the_curve_is_its_prior_and_a_free_token_has_no_knee():
    assert LatencyCurve(5.0, 0.02, scale_tokens=100).coefficients() == pytest.approx((5.0, 0.02))
    assert math.isinf(LatencyCurve(5.0, 0.0, scale_tokens=100).knee_tokens())


def test_the_curve_stays_physical_on_samples_that_say_time_shrinks_with_work():
    curve = LatencyCurve(10.0, 0.01, scale_tokens=100)
    for tokens in (10, 1000) * 50:
        curve.observe(tokens, 50.0 - 0.04 * tokens)
    a, b = curve.coefficients()
    assert a >= 0 and b >= 0


def test_adaptive_at_low_load_sends_at_once():
    f = former(adaptive=True, wait_ms=50)
    (batch,) = f.add(member(0.0), 0.0)  # nobody else is expected during its call: its target size is itself
    assert batch.closed_by == "size" and batch.sent_at == 0.0


def test_adaptive_gathers_about_one_calls_worth_of_arrivals_below_the_knee():
    f = former(adaptive=True, items=64, wait_ms=50, base_ms=40.0, ms_per_token=0.001)  # knee 40,000 tokens
    t, sizes = 0.0, []
    for _ in range(2000):  # 200 arrivals/s for 10 s, a call of ~40 ms: about 8 arrive during one
        t += 0.005
        for b in f.add(member(t, tokens=10), t) + f.poll(t):
            sizes.append(len(b.members))
            f.finished(b, t)  # calls free at once: only the target decides
    steady = sizes[3 * len(sizes) // 4 :]  # the decayed rate has caught up (tau 2 s)
    assert 6 <= sum(steady) / len(steady) <= 10


def test_adaptive_closes_at_the_knee_and_waits_no_longer_than_it_takes_to_fill_it():
    f = former(adaptive=True, items=64, wait_ms=50, base_ms=20.0, ms_per_token=0.02)  # knee: 1000 tokens
    t, sent = 0.0, []
    for _ in range(200):  # 1000 arrivals/s of 100 tokens: the knee fills in about 10 ms
        t += 0.001
        sent += f.add(member(t, tokens=100), t) + f.poll(t)
        for b in sent[-1:]:
            if f.in_flight:
                f.finished(b, t)
    late = [b for b in sent if b.sent_at > 0.1]
    assert late and all(b.tokens <= 1000 for b in late)
    assert sum(b.closed_by == "size" for b in late) >= len(late) // 2
    assert all(b.sent_at - min(m.arrived_at for m in b.members) <= 0.050 + 1e-9 for b in sent)


# --- invariants ------------------------------------------------------------------------

_arrival = st.fixed_dictionaries(
    {
        "gap_ms": st.floats(0, 20),
        "key": st.sampled_from(["a", "b"]),
        "items": st.integers(1, 4),
        "longest": st.integers(1, 600),
        "budget_ms": st.one_of(st.none(), st.floats(0, 200)),
        "leave_after_ms": st.one_of(st.none(), st.floats(0, 30)),
    }
)


def _drive(f: BatchFormer, arrivals: list[dict], finish_after_ms: float | None) -> tuple[list[Batch], set[int], dict]:
    """Run arrivals, leaves and timers in time order; finish each batch `finish_after_ms` after it left."""
    t, events, members = 0.0, [], {}
    for a in arrivals:
        t += a["gap_ms"] / 1000.0
        tokens = a["longest"] * a["items"] - (a["items"] - 1)  # the longest input, the others 1 token
        if not f.bounds.fits(a["items"], tokens):
            continue  # the runtime forwards it alone, unbatched
        deadline = None if a["budget_ms"] is None else t + a["budget_ms"] / 1000.0
        m = Member(len(members) + 1, a["key"], a["items"], tokens, a["longest"], t, deadline)
        members[m.id] = m
        events.append((t, 0, m.id))
        if a["leave_after_ms"] is not None:
            events.append((t + a["leave_after_ms"] / 1000.0, 1, m.id))
    events.sort()
    sent: list[Batch] = []
    left: set[int] = set()
    finishing: list[tuple[float, Batch]] = []
    peak = 0

    def take(batches: list[Batch], now: float) -> None:
        nonlocal peak
        for b in batches:
            sent.append(b)
            if finish_after_ms is not None:
                finishing.append((now + finish_after_ms / 1000.0, b))
        peak = max(peak, f.in_flight)

    i, now = 0, 0.0
    while i < len(events) or f.waiting or finishing:
        candidates = [events[i][0]] if i < len(events) else []
        wake = f.wake_at(now)
        if wake is not None:
            candidates.append(max(now, wake))
        if finishing:
            candidates.append(min(at for at, _ in finishing))
        if not candidates:
            break
        now = max(now, min(candidates))
        for entry in [e for e in finishing if e[0] <= now]:
            finishing.remove(entry)
            take(f.finished(entry[1], now), now)
        take(f.poll(now), now)
        while i < len(events) and events[i][0] <= now:
            _, kind, mid = events[i]
            if kind == 0:
                take(f.add(members[mid], now), now)
            elif f.leave(mid, now):
                left.add(mid)
            i += 1
    return sent, left, {"members": members, "peak": peak}


@settings(max_examples=150, deadline=None)
@given(st.lists(_arrival, min_size=1, max_size=40), st.booleans(), st.sampled_from([(), (64,), (32, 256)]))
def test_batches_respect_bounds_keys_buckets_windows_and_deadlines(arrivals, adaptive, buckets):
    f = former(items=6, tokens=1500, wait_ms=10, buckets=buckets, adaptive=adaptive)
    sent, left, info = _drive(f, arrivals, finish_after_ms=None)
    members = info["members"]
    seen = [mid for b in sent for mid in ids(b)]
    assert len(seen) == len(set(seen)), "a member left in two batches"
    assert set(seen) | left == set(members) and not set(seen) & left, "every member leaves exactly once"
    for b in sent:
        assert b.items <= 6 and b.tokens <= 1500
        assert len({m.key for m in b.members}) == 1
        assert len({f.bounds.bucket(m.longest) for m in b.members}) == 1
        expected_s = DEADLINE_SAFETY * f.curve.expected_ms(b.tokens) / 1000.0
        for m in b.members:
            assert b.sent_at >= m.arrived_at
            assert b.sent_at <= m.arrived_at + 0.010 + 1e-9, "waited past its window"
            if m.deadline is not None:
                assert b.sent_at <= max(m.arrived_at, m.deadline - expected_s) + 1e-9, "waited past its deadline"


@settings(max_examples=100, deadline=None)
@given(st.lists(_arrival, min_size=1, max_size=40), st.integers(1, 3), st.floats(1, 40))
def test_in_flight_never_exceeds_max_concurrent_and_everyone_is_served(arrivals, concurrent, rtt_ms):
    f = former(items=6, tokens=1500, wait_ms=10, concurrent=concurrent)
    sent, left, info = _drive(f, arrivals, finish_after_ms=rtt_ms)
    assert info["peak"] <= concurrent
    assert {mid for b in sent for mid in ids(b)} | left == set(info["members"])
    assert f.in_flight == 0 and f.waiting == 0 and f.open_groups == 0
