"""Learning from requests that did not finish (issue 12 item 2): censored floors, coefficient
clamps, unjudged routes. Pure core, a hand-advanced clock, Hypothesis invariants."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.arrival import ArrivalGate
from proxy.core.censored import FADE_MULTIPLE, INFLATE, MAX_STREAK, CensoredFloors, shape_bucket
from proxy.core.cost import Cost
from proxy.core.decisions import Admit, Enqueue, Outcome, Ticket
from proxy.core.service_model import ServiceModel
from proxy.core.wire import Reason
from proxy.policy import shedding as shedding_policy
from proxy.policy.admission import Limits, Route, Scheduling
from proxy.policy.schema import Policy, Upstream
from proxy.policy.shedding import Shedding

samples = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 2000), st.floats(0.01, 1e6)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(samples, st.integers(0, 5000), st.integers(0, 2000), st.floats(0.0, 1e7), st.floats(0.0, 1e4))
def test_a_censored_update_never_lowers_the_estimate_nor_leaves_it_below_the_cut(done, prompt, out, cut_ms, now):
    m = ServiceModel(5.0, 0.02, 3.0)
    for i, (p, o, ms) in enumerate(done):
        m.observe(p, o, ms)
        if i % 3 == 0:
            m.observe_censored(p, o, ms * 2, now)
    before = m.expected_ms(prompt, out, now)
    m.observe_censored(prompt, out, cut_ms, now)
    after = m.expected_ms(prompt, out, now)
    assert after >= before
    assert after >= cut_ms
    assert m.judged == (bool(done) or m.floors.informative > 0)


def test_cuts_search_upward_geometrically_and_a_finish_ends_the_streak() -> None:
    f = CensoredFloors()
    key = shape_bucket(100, 0)
    assert not f.censored(key, 5.0, 9.0, 0.0)  # cut before the model's own guess: no news
    assert f.floor_ms(key, 0.0) == 0.0 and (f.cuts, f.informative) == (1, 0)
    now = 0.0
    for k in range(1, 4):  # each cut request went upstream after the floor last rose: one search step each
        now += 0.2
        assert f.censored(key, 200.0, 9.0, now)
        assert math.isclose(f.floor_ms(key, now), 200.0 * (1 + INFLATE) ** k)
    f.completed(key, 150.0, now)  # it can be done in 150 ms after all
    assert f.floor_ms(key, now) == 150.0
    assert f.censored(key, 200.0, 9.0, now + 0.2)
    assert math.isclose(f.floor_ms(key, now + 0.2), 200.0 * (1 + INFLATE))  # the streak started over
    assert f.floor_ms(shape_bucket(5000, 0), 0.0) == 0.0  # other shapes are not touched


def test_requests_cut_together_teach_one_fact_not_a_search() -> None:
    # Round 1 on vLLM: the requests in flight when the backend slowed were cut one after another,
    # each within a deadline of the first; each stepped the search (1.25x) and took a 4 s floor to 14.6x.
    f = CensoredFloors()
    key = shape_bucket(10, 256)
    for i in range(16):  # went upstream 0.1 s apart, each cut at its 4 s deadline
        assert f.censored(key, 4000.0, 900.0, 4.0 + 0.1 * i)
    assert math.isclose(f.floor_ms(key, 5.5), 4000.0 * (1 + INFLATE)) and f.informative == 16
    assert f.censored(key, 4000.0, 900.0, 9.6)  # one that went upstream at 5.6, after the floor rose: a step
    assert math.isclose(f.floor_ms(key, 9.6), 4000.0 * (1 + INFLATE) ** 2)


def test_the_inflation_fades_in_the_shapes_own_time_and_the_evidence_stands_until_a_finish() -> None:
    f = CensoredFloors()
    for cut_ms in (200.0, 20_000.0):
        key = shape_bucket(int(cut_ms), 0)
        now = 0.0
        for _ in range(MAX_STREAK):  # a long streak: the floor is 14.6x the cut
            now += cut_ms / 1000.0
            f.censored(key, cut_ms, 1.0, now)
        floor = cut_ms * (1 + INFLATE) ** MAX_STREAK
        assert math.isclose(f.floor_ms(key, now), floor)
        tau_s = FADE_MULTIPLE * cut_ms / 1000.0  # the cut's scale, not the inflated floor's
        assert math.isclose(f.floor_ms(key, now + tau_s), floor / math.e)
        standing = cut_ms * (1 + INFLATE)  # no finish since: the cut itself (one search step) stands
        assert f.floor_ms(key, now + 1000 * tau_s) == standing
        f.completed(key, cut_ms * 0.5, now + 1000 * tau_s)  # a finish: the floor falls to it and fades whole
        assert f.floor_ms(key, now + 1000 * tau_s) == cut_ms * 0.5
        assert f.floor_ms(key, now + 1010 * tau_s) < cut_ms * 1e-4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100_000), st.integers(0, 10_000), st.floats(0.01, 1e7)), max_size=60))
def test_learned_coefficients_stay_in_physical_ranges(data) -> None:
    m = ServiceModel(20.0, 0.1, 20.0, memory_samples=20)
    for p, o, ms in data:
        m.observe(p, o, ms)
        a, b, c = m.coefficients
        assert b >= 0.0 and c >= 0.0 and a >= 0.0
        assert a <= m._min_ms + 1e-9  # no request is faster than the fixed cost


def test_a_slope_the_data_pulls_negative_is_held_at_zero_and_the_base_refit() -> None:
    # vLLM in issue 12: longer prompts looked no slower (batching hid prefill); unconstrained
    # least squares gave a negative ms/prompt token and a base cost above every short answer.
    rng = random.Random(3)
    m = ServiceModel(20.0, 0.1, 20.0)
    for _ in range(2000):
        p = rng.randint(10, 3000)
        o = rng.randint(10, 200)
        ms = (80.0 - 0.01 * p + 7.0 * o) * rng.uniform(0.95, 1.05)  # the confounded data
        m.observe(p, o, ms)
    a, b, c = m.coefficients
    assert b == 0.0 and c > 0.0
    assert 0.0 <= a <= m._min_ms


def embeddings_policy(**sched) -> Policy:
    return Policy(
        upstreams=[Upstream(url="http://127.0.0.1:8000")],
        routes=[Route(path_prefix="/embeddings", kind="embeddings", base_ms=5.0, ms_per_prompt_token=0.02)],
        scheduling=Scheduling(default_class="interactive", **sched),
        limits=Limits(kind="fixed", initial_limit=8, min_limit=1),
        shedding=Shedding(rules=[]),
    )


def gated(policy: Policy) -> AdmissionController:
    service = shedding_policy.latency_family(policy.latency)
    gate = ArrivalGate(policy, shedding_policy.shedder(policy.shedding, 3, random.Random(0)), None)
    return AdmissionController(policy, rng=random.Random(0), gate=gate, service=service)


def embed(ctl: AdmissionController, now: float, budget_ms: int = 200) -> Ticket:
    cost = ctl.estimate("/embeddings", b'{"input": "' + b"x" * 800 + b'"}')
    return ctl.ticket("interactive", cost, now + budget_ms / 1000, budget_ms, now=now)


def test_a_deadline_the_backend_cannot_meet_becomes_unmeetable_after_a_cut() -> None:
    # The prior says ~9 ms; the backend takes seconds: every request is cut at its 200 ms deadline.
    ctl = gated(embeddings_policy())
    now, cut = 0.0, 0
    for _ in range(5):
        t = embed(ctl, now)
        d = ctl.arrive(t, now)
        if not isinstance(d, Admit):
            break
        now += 0.2
        ctl.release(d.lease, now, Outcome.CANCELLED, 200.0)  # cut at the deadline, after 200 ms upstream
        cut += 1
    assert cut == 1 and d.reason is Reason.DEADLINE_UNMEETABLE
    assert d.retry_after_ms is None  # only a larger budget helps
    big = ctl.arrive(embed(ctl, now, budget_ms=5000), now)  # a budget that covers it goes ahead
    assert isinstance(big, Admit)


def test_an_unjudged_route_sends_one_request_with_a_deadline_at_a_time() -> None:
    ctl = AdmissionController(embeddings_policy(), rng=random.Random(0))
    first = ctl.arrive(embed(ctl, 0.0, 5000), 0.0)
    second = ctl.arrive(embed(ctl, 0.0, 5000), 0.0)
    free = Ticket(99, "interactive", Cost(1, 0, 1, route="/embeddings"), 9.0, math.inf)  # no deadline: not held
    third = ctl.arrive(free, 0.0)
    assert isinstance(first, Admit) and isinstance(second, Enqueue) and isinstance(third, Admit)
    woken = ctl.release(first.lease, 0.5, Outcome.SUCCESS, 500.0)  # the first answer judges the route
    assert [type(d) for d in woken] == [Admit] and woken[0].ticket.id == second.ticket.id
    assert ctl.models.judged("/embeddings") and ctl.statistics(0.5)["models"]["/embeddings"]["judged"]


def test_a_warm_up_probe_judges_the_route_and_lets_held_requests_go() -> None:
    ctl = AdmissionController(embeddings_policy(), rng=random.Random(0))
    held = [ctl.arrive(embed(ctl, 0.0, 5000), 0.0) for _ in range(3)]
    assert [type(d) for d in held] == [Admit, Enqueue, Enqueue]
    ctl.learn_probe("/embeddings", b'{"input": "' + b"x" * 800 + b'"}', 1500.0, 0.1)
    assert {d.ticket.id for d in ctl.take_woken()} == {held[1].ticket.id, held[2].ticket.id}
    stats = ctl.models.statistics(0.1)["/embeddings"]
    assert stats["seeded_samples"] == 1 and stats["samples"] == 1
    assert ctl.ticket("interactive", embed(ctl, 0.1).cost, now=0.1).expected_ms > 100  # the probe, not the prior


def test_trusting_the_priors_is_a_policy_choice() -> None:
    ctl = AdmissionController(embeddings_policy(unjudged_in_flight=0), rng=random.Random(0))
    assert all(isinstance(ctl.arrive(embed(ctl, 0.0, 5000), 0.0), Admit) for _ in range(3))


def test_usage_of_all_zeros_is_no_usage() -> None:
    # LitServe's OpenAI spec answers "usage": {"prompt_tokens": 0, "completion_tokens": 0}: taken at its
    # word, every request generated nothing and the model could not tell a short answer from a long one.
    from proxy.core.decisions import Observed

    policy = Policy(
        upstreams=[Upstream(url="http://127.0.0.1:8000")],
        scheduling=Scheduling(unjudged_in_flight=0),
        limits=Limits(kind="fixed", initial_limit=8, min_limit=1),
    )
    ctl = AdmissionController(policy, rng=random.Random(0))
    chat = "/v1/chat/completions"
    for tokens, ms in ((16, 320.0), (256, 5120.0)) * 30:
        cost = ctl.estimate(chat, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": %d}' % tokens)
        d = ctl.arrive(ctl.ticket("interactive", cost, now=0.0), 0.0)
        ctl.release(d.lease, 0.0, Outcome.SUCCESS, ms, Observed(0, 0))
    short = ctl.estimate(chat, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}')
    long_ = ctl.estimate(chat, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 256}')
    assert ctl.ticket("interactive", long_).expected_ms > 5 * ctl.ticket("interactive", short).expected_ms
