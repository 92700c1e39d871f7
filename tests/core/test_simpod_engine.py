"""The simulated engine, pure: hand-advanced clock, exact figures, Hypothesis invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.simpod.engine import CANCELLED, FINISHED, RUNNING, WAITING, Engine, transition
from proxy.simpod.profiles import Profile
from proxy.simpod.workload import CHAT, EMBEDDING, Job

P = Profile(base_ms=10.0, per_seq_ms=1.0, prefill_ms_per_token=0.5, max_num_seqs=3, kv_capacity_tokens=100)


def gen(prompt: int = 10, out: int = 3, cap: int | None = None) -> Job:
    cap = out if cap is None else cap
    return Job(CHAT, "m", prompt, out, cap, out, prompt + cap, False, False, ())


def emb(prompt: int = 10) -> Job:
    return Job(EMBEDDING, "m", prompt, 0, 0, 1, prompt, False, False, ("x",))


def run_step(engine: Engine, now: float) -> tuple[float, list]:
    duration = engine.begin_step(now)
    assert duration is not None
    return duration, engine.end_step(now + duration)


def test_step_time_formula_and_first_token_in_prefill_step() -> None:
    e = Engine(P)
    a = e.submit(gen(prompt=10, out=2), 0.0)
    b = e.submit(gen(prompt=20, out=1), 0.0)
    duration, progressed = run_step(e, 0.0)
    # base 10 + 2 running * 1 + 30 prompt tokens * 0.5 = 27 ms
    assert duration == pytest.approx(0.027)
    assert progressed == [a, b]
    assert (a.generated, a.state, b.generated, b.state) == (1, RUNNING, 1, FINISHED)
    duration, progressed = run_step(e, 1.0)
    assert duration == pytest.approx(0.011)  # decode only, one running
    assert a.state is FINISHED and a.generated == 2
    assert e.begin_step(2.0) is None and not e.has_work


def test_admission_is_fcfs_and_bounded_by_max_num_seqs() -> None:
    e = Engine(P)
    seqs = [e.submit(gen(prompt=1, out=5), 0.0) for _ in range(5)]
    e.begin_step(0.0)
    assert [s.state for s in seqs] == [RUNNING] * 3 + [WAITING] * 2
    s = e.statistics()
    assert (s.running, s.waiting, s.requests_executed) == (3, 2, 3)


def test_kv_head_of_line_blocks_smaller_requests_behind_it() -> None:
    e = Engine(P)
    big1 = e.submit(gen(prompt=50, out=10), 0.0)  # 60 KV tokens
    big2 = e.submit(gen(prompt=50, out=10), 0.0)  # would make 120 > 100
    small = e.submit(gen(prompt=1, out=1), 0.0)  # fits, but must not overtake
    e.begin_step(0.0)
    assert (big1.state, big2.state, small.state) == (RUNNING, WAITING, WAITING)
    assert e.statistics().kv_reserved_tokens == 60


def test_kv_reserves_max_tokens_not_true_length() -> None:
    e = Engine(P)
    a = e.submit(gen(prompt=10, out=1, cap=80), 0.0)  # reserves 90
    b = e.submit(gen(prompt=10, out=1, cap=1), 0.0)  # 11 more: 101 > 100
    e.begin_step(0.0)
    assert (a.state, b.state) == (RUNNING, WAITING)
    e.end_step(0.1)  # a finishes after one token, freeing its 90
    e.begin_step(0.1)
    assert b.state is RUNNING


def test_embeddings_finish_in_their_admission_step() -> None:
    e = Engine(P)
    x = e.submit(emb(40), 0.0)
    duration, _ = run_step(e, 0.0)
    assert duration == pytest.approx(0.031)  # 10 + 1 + 40 * 0.5
    assert x.state is FINISHED and x.generated == 0
    s = e.statistics()
    assert (s.prompt_tokens, s.output_tokens, s.requests_completed) == (40, 0, 1)


def test_speed_divides_every_engine_time() -> None:
    e = Engine(Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0, speed=4.0))
    e.submit(gen(), 0.0)
    assert e.begin_step(0.0) == pytest.approx(0.0025)


def test_slowdown_and_cold_penalty_multiply_the_step() -> None:
    e = Engine(P, cold_penalty=4.0, cold_penalty_requests=2)
    assert e.cold_multiplier() == 4.0
    e.submit(emb(1), 0.0)
    # first step: 4x (no request executed before it), 3x slowdown
    assert e.begin_step(0.0, slowdown=3.0) == pytest.approx(0.0115 * 12)
    e.end_step(1.0)
    assert e.cold_multiplier() == pytest.approx(2.5)  # one of two executed: halfway
    e.submit(emb(1), 1.0)
    e.begin_step(1.0)
    e.end_step(2.0)
    assert e.cold_multiplier() == 1.0
    e.reset_stats()
    assert e.cold_multiplier() == 1.0  # the engine stays warm across a stats reset


def test_cancel_running_frees_kv_and_counts_its_work_as_wasted() -> None:
    e = Engine(P)
    a = e.submit(gen(prompt=10, out=5), 0.0)
    b = e.submit(gen(prompt=10, out=1), 0.0)
    run_step(e, 0.0)
    e.begin_step(1.0)
    e.cancel(a, 1.005)  # mid-step: the priced step stays charged
    assert a.state is CANCELLED
    e.end_step(1.011)
    assert a.generated == 1
    s = e.statistics()
    assert s.kv_reserved_tokens == 0 and s.running == 0
    assert s.requests_cancelled_running == 1 and s.requests_cancelled == 1
    assert s.wasted_client_gone_s == pytest.approx(a.engine_s)
    assert s.useful_s == pytest.approx(b.engine_s)
    assert s.busy_s == pytest.approx(s.useful_s + s.wasted_s)


def test_cancel_waiting_costs_nothing_and_is_skipped() -> None:
    e = Engine(Profile(max_num_seqs=1))
    a = e.submit(gen(), 0.0)
    b = e.submit(gen(), 0.0)
    c = e.submit(gen(), 0.0)
    e.begin_step(0.0)
    e.cancel(b, 0.001)
    assert e.statistics().waiting == 1
    e.end_step(0.01)
    e.cancel(a, 0.01)
    e.begin_step(0.01)
    assert c.state is RUNNING and b.engine_s == 0.0
    s = e.statistics()
    assert (s.requests_cancelled_waiting, s.requests_cancelled_running, s.wasted_s > 0) == (1, 1, True)


def test_late_completion_and_cancel_after_deadline_count_as_deadline_waste() -> None:
    e = Engine(P)
    late = e.submit(gen(out=2), 0.0, deadline=0.015)
    quit_ = e.submit(gen(out=5), 0.0, deadline=0.02)
    on_time = e.submit(gen(out=1), 0.0, deadline=10.0)
    run_step(e, 0.0)
    run_step(e, 0.05)
    e.cancel(quit_, 0.1)
    s = e.statistics()
    assert s.requests_late == 1
    assert s.wasted_deadline_s == pytest.approx(late.engine_s + quit_.engine_s)
    assert s.wasted_client_gone_s == 0.0
    assert s.useful_s == pytest.approx(on_time.engine_s)


def test_executions_are_counted_per_idempotency_key_at_admission() -> None:
    e = Engine(Profile(max_num_seqs=1))
    e.submit(gen(out=1), 0.0, key="k1")
    e.submit(gen(out=1), 0.0, key="k1")
    e.submit(gen(out=1), 0.0)
    run_step(e, 0.0)
    assert e.statistics().executions_by_idempotency_key == {"k1": 1}
    run_step(e, 1.0)
    assert e.statistics().executions_by_idempotency_key == {"k1": 2}


def test_reset_stats_zeroes_counters_and_keeps_accounting_consistent() -> None:
    e = Engine(P)
    a = e.submit(gen(out=3), 0.0)
    run_step(e, 0.0)
    e.reset_stats()
    s = e.statistics()
    assert (s.busy_s, s.requests_executed, s.running, s.in_progress_s) == (0.0, 0, 1, 0.0)
    run_step(e, 1.0)
    run_step(e, 2.0)
    s = e.statistics()
    assert a.state is FINISHED
    assert s.busy_s == pytest.approx(s.useful_s) and s.output_tokens == 2


def test_unknown_transitions_raise() -> None:
    with pytest.raises(RuntimeError):
        transition(FINISHED, "cancel")
    e = Engine(P)
    with pytest.raises(RuntimeError):
        e.end_step(0.0)
    e.submit(gen(), 0.0)
    e.begin_step(0.0)
    with pytest.raises(RuntimeError):
        e.begin_step(0.0)


def test_a_request_bigger_than_the_cache_is_refused_at_submit() -> None:
    with pytest.raises(ValueError):
        Engine(P).submit(gen(prompt=90, out=20), 0.0)


# --- invariants under random workloads ---
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(1, 60),
            st.integers(1, 8),
            st.integers(0, 30),
            st.booleans(),
            st.sampled_from([None, 0.01, 0.05]),
        ),
        st.tuples(st.just("step"), st.floats(0.0, 0.005)),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_hold_under_any_sequence_of_events(events) -> None:
    e = Engine(P)
    now, submitted, admitted_order = 0.0, [], []
    for ev in events:
        if ev[0] == "submit":
            _, prompt, out, extra, is_emb, budget = ev
            job = emb(prompt) if is_emb else gen(prompt, out, min(out + extra, 100 - prompt))
            if job.kv_tokens > P.kv_capacity_tokens or (not is_emb and job.max_tokens < job.output_tokens):
                continue
            submitted.append(e.submit(job, now, deadline=None if budget is None else now + budget))
        elif ev[0] == "cancel" and submitted:
            seq = submitted[ev[1] % len(submitted)]
            if not seq.done:
                e.cancel(seq, now)
        elif ev[0] == "step":
            before = {s: s.generated for s in submitted if s.state is RUNNING}
            duration = e.begin_step(now)
            if duration is None:
                assert not e.has_work
                continue
            admitted_order += [s for s in submitted if s.state is RUNNING and s not in before]
            now += duration + ev[1]
            for s in e.end_step(now):
                gained = s.generated - before.get(s, 0)
                assert gained == (1 if s.job.output_tokens else 0)  # one token per step
        s = e.statistics()
        assert s.running <= P.max_num_seqs
        assert 0 <= s.kv_reserved_tokens <= P.kv_capacity_tokens
        assert s.kv_reserved_tokens == sum(q.job.kv_tokens for q in submitted if q.state is RUNNING)
        assert s.busy_s == pytest.approx(sum(q.engine_s for q in submitted), abs=1e-9)
        assert s.busy_s == pytest.approx(s.useful_s + s.wasted_s + s.in_progress_s, abs=1e-9)
        assert s.waiting == sum(1 for q in submitted if q.state is WAITING)
        assert all(q.generated <= q.job.output_tokens for q in submitted)
    # FCFS: sequences entered the batch in submission order
    assert admitted_order == sorted(admitted_order, key=lambda q: q.seq_id)


# --- real servers' habits (issue 12) ---
KEEPS = Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0, max_num_seqs=1, stops_on_cancel=False)


def test_an_engine_that_keeps_computing_orphans_a_cancelled_sequence_and_runs_it_to_the_end() -> None:
    e = Engine(KEEPS)
    a = e.submit(gen(prompt=1, out=3), 0.0)
    b = e.submit(gen(prompt=1, out=1), 0.0)
    run_step(e, 0.0)
    e.cancel(a, 0.015)
    e.cancel(a, 0.016)  # idempotent
    e.cancel(b, 0.016)  # queued: it still runs, after a (FIFO)
    s = e.statistics()
    assert (a.state, b.state, s.requests_orphaned, s.orphans, s.requests_cancelled) == (RUNNING, WAITING, 2, 2, 0)
    now = 0.01
    while e.has_work:
        duration, _ = run_step(e, now)
        now += duration
    assert (a.state, b.state, a.generated) == (FINISHED, FINISHED, 3)
    s = e.statistics()
    assert s.orphans == 0 and s.useful_s == 0.0
    assert s.wasted_client_gone_s == pytest.approx(s.busy_s) == pytest.approx(0.04)
    assert e.idle_since == pytest.approx(0.04)


def test_idle_since_is_none_while_busy_and_set_when_the_last_sequence_leaves() -> None:
    e = Engine(P)
    assert e.idle_since is None
    a = e.submit(gen(prompt=1, out=2), 0.0)
    run_step(e, 0.0)
    assert e.idle_since is None
    e.cancel(a, 0.5)  # this profile stops on cancel: idle at once
    assert e.idle_since == 0.5 and e.statistics().idle_since == 0.5


PADDED = Profile(base_ms=10.0, per_seq_ms=1.0, prefill_ms_per_token=0.5, max_num_seqs=2, batching="padded")


def test_a_padded_batch_pads_prefill_to_the_longest_prompt_and_ends_with_its_longest_member() -> None:
    e = Engine(PADDED)
    short = e.submit(gen(prompt=2, out=1), 0.0)
    long_ = e.submit(gen(prompt=20, out=3), 0.0)
    late = e.submit(gen(prompt=2, out=1), 0.0)
    duration, _ = run_step(e, 0.0)
    # base 10 + 2 * 1 + both padded to 20 prompt tokens: 2 * 20 * 0.5 = 32 ms
    assert duration == pytest.approx(0.032)
    assert (short.generated, short.state, late.state) == (1, RUNNING, WAITING)  # done, held by the batch
    duration, _ = run_step(e, 1.0)
    assert duration == pytest.approx(0.012) and late.state is WAITING  # nobody joins a running batch
    run_step(e, 2.0)
    assert (short.state, long_.state, short.generated, long_.generated) == (FINISHED, FINISHED, 1, 3)
    assert short.finished_at == long_.finished_at
    run_step(e, 3.0)
    assert late.state is FINISHED


def test_a_serial_engine_is_strict_fifo() -> None:
    e = Engine(Profile(max_num_seqs=1, base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0))
    seqs = [e.submit(gen(prompt=1, out=n), 0.0) for n in (5, 1, 3)]
    order, now = [], 0.0
    while e.has_work:
        duration, progressed = run_step(e, now)
        now += duration
        order += [s.seq_id for s in progressed if s.state is FINISHED]
    assert order == [s.seq_id for s in seqs]


@settings(max_examples=100, deadline=None)
@given(ops, st.booleans(), st.booleans())
def test_accounting_holds_for_padded_and_keeps_computing_engines(events, padded, stops) -> None:
    profile = Profile(
        base_ms=10.0,
        per_seq_ms=1.0,
        prefill_ms_per_token=0.5,
        max_num_seqs=3,
        kv_capacity_tokens=100,
        batching="padded" if padded else "continuous",
        stops_on_cancel=stops,
    )
    e = Engine(profile)
    now, submitted = 0.0, []
    for ev in events:
        if ev[0] == "submit":
            _, prompt, out, extra, is_emb, budget = ev
            job = emb(prompt) if is_emb else gen(prompt, out, min(out + extra, 100 - prompt))
            if job.kv_tokens > profile.kv_capacity_tokens or (not is_emb and job.max_tokens < job.output_tokens):
                continue
            submitted.append(e.submit(job, now, deadline=None if budget is None else now + budget))
        elif ev[0] == "cancel" and submitted:
            seq = submitted[ev[1] % len(submitted)]
            if not seq.done:
                e.cancel(seq, now)
        elif ev[0] == "step":
            duration = e.begin_step(now)
            if duration is None:
                continue
            now += duration + ev[1]
            e.end_step(now)
        s = e.statistics()
        assert s.running <= profile.max_num_seqs and 0 <= s.kv_reserved_tokens <= profile.kv_capacity_tokens
        assert s.busy_s == pytest.approx(s.useful_s + s.wasted_s + s.in_progress_s, abs=1e-9)
        assert s.orphans == sum(1 for q in submitted if q.orphaned and not q.done)
        assert (s.idle_since is None) or not e.has_work
        if not stops:
            assert s.requests_cancelled == 0  # nothing is ever dropped
        if padded:  # members of one batch (admitted in one step) finish together
            ends: dict[float, set] = {}
            for q in submitted:
                if q.state is FINISHED:
                    ends.setdefault(q.admitted_at, set()).add(q.finished_at)
            assert all(len(v) == 1 for v in ends.values())
