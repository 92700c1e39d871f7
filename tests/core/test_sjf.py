"""Per-class SJF/FCFS queues (aging, overdue FIFO, lazy deletion) and the class picker."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.sjf import ClassPicker, ClassQueue, Entry, sjf_key


@dataclass(frozen=True)
class T:
    id: int
    expected_ms: float
    klass: str = "c"


@dataclass(frozen=True)
class C:
    priority: int
    weight: int


def fill(q: ClassQueue, items) -> list[Entry]:
    entries = []
    for seq, (expected, at) in enumerate(items):
        e = Entry(T(seq, float(expected)), float(at), seq)
        q.push(e)
        entries.append(e)
    return entries


def drain(q: ClassQueue) -> list[int]:
    out = []
    while (e := q.best()) is not None:
        q.remove(e)
        out.append(e.ticket.id)
    return out


@given(
    st.lists(st.tuples(st.integers(1, 10_000), st.integers(0, 100)), min_size=1, max_size=40),
    st.integers(0, 3000),
    st.integers(0, 50),
)
def test_fixed_key_orders_exactly_like_the_aging_formula(items, aging_ms_per_s, extra_s):
    """Integers keep float arithmetic exact: the heap order is the formula's order at any `now`."""
    now = max(at for _, at in items) + extra_s
    q = ClassQueue("c", "sjf", aging_ms_per_s, max_wait_s=1e9)
    fill(q, items)
    # expected_ms - aging * waited, with aging in ms per s and waits in whole seconds: exact integers
    by_formula = sorted(range(len(items)), key=lambda i: (items[i][0] - aging_ms_per_s * (now - items[i][1]), i))
    assert drain(q) == by_formula


def test_aging_lets_a_long_request_overtake_fresh_short_ones():
    q = ClassQueue("c", "sjf", aging_ms_per_s=1000.0, max_wait_s=1e9)
    fill(q, [(5000, 0)])  # a 5 s job waiting since t=0
    fill_later = [Entry(T(1, 100.0), 10.0, 1)]  # a 100 ms job arriving at t=10 s
    q.push(fill_later[0])
    assert sjf_key(5000, 0, 1000) < sjf_key(100, 10, 1000)  # 5000 - 10000 < 100
    assert drain(q) == [0, 1]


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=30))
def test_fcfs_is_arrival_order_whatever_the_cost(costs):
    q = ClassQueue("c", "fcfs", 1000.0, 1e9)
    fill(q, [(c, i) for i, c in enumerate(costs)])
    assert drain(q) == list(range(len(costs)))


def test_removed_entries_are_never_returned_and_memory_is_reclaimed():
    q = ClassQueue("c", "sjf", 0.0, max_wait_s=5.0)
    entries = fill(q, [(i % 7 + 1, i) for i in range(500)])
    for e in entries[:400]:
        q.remove(e)
    assert len(q) == 100 and len(q._heap) <= 2 * 100 + 64
    assert sorted(drain(q)) == list(range(400, 500))
    assert q.backlog_ms == 0.0 and q.best() is None and q.oldest() is None


def test_oldest_and_overdue_time():
    q = ClassQueue("c", "sjf", 0.0, max_wait_s=2.0)
    a, b = fill(q, [(900, 1), (10, 3)])
    assert q.best() is b and q.oldest() is a and q.overdue_at() == 3.0
    q.remove(a)
    assert q.oldest() is b and q.overdue_at() == 5.0


def test_work_ahead():
    q = ClassQueue("c", "sjf", 0.0, 1e9)
    fill(q, [(10, 0), (20, 0), (1000, 0), (5000, 0)])
    assert q.work_ahead_ms(1) == 0.0
    assert q.work_ahead_ms(100) == 30.0  # only the shorter ones
    assert q.work_ahead_ms(20) == 30.0  # and all of its own log2 bucket (aging: older ones of its size go first)
    assert q.work_ahead_ms(float("inf")) > 0
    fcfs = ClassQueue("c", "fcfs", 0.0, 1e9)
    fill(fcfs, [(10, 0), (20, 0), (1000, 0), (5000, 0)])
    assert fcfs.work_ahead_ms(1) == 6030.0  # FCFS: everything


CLASSES = {"realtime": C(0, 8), "interactive": C(1, 4), "batch": C(2, 1)}


def test_strict_order_is_by_priority():
    p = ClassPicker("strict", CLASSES)
    assert p.order({"batch", "interactive"}) == ["interactive", "batch"]
    assert p.order({"batch", "realtime", "interactive"}) == ["realtime", "interactive", "batch"]
    p.commit("realtime", {"realtime"})  # strict mode keeps no state
    assert p.order(set()) == []


@given(
    st.dictionaries(st.sampled_from("abcde"), st.integers(1, 20), min_size=2, max_size=5),
    st.integers(1, 5),
)
def test_weighted_share_is_exact_over_whole_rounds(weights, rounds):
    classes = {name: C(i, w) for i, (name, w) in enumerate(sorted(weights.items()))}
    p = ClassPicker("weighted", classes)
    total = sum(weights.values())
    picks = Counter()
    for _ in range(total * rounds):
        chosen = p.order(set(classes))[0]
        p.commit(chosen, set(classes))
        picks[chosen] += 1
    assert picks == Counter({n: w * rounds for n, w in weights.items()})


def test_weighted_picks_interleave():
    p = ClassPicker("weighted", {"a": C(0, 2), "b": C(1, 1)})
    seq = []
    for _ in range(6):
        chosen = p.order({"a", "b"})[0]
        p.commit(chosen, {"a", "b"})
        seq.append(chosen)
    assert seq == ["a", "b", "a", "a", "b", "a"]  # smooth: never a burst of the whole weight
    assert p.statistics()["mode"] == "weighted"
