"""Completed samples folded in batches (issue 16): the same state as one at a time, and folded
whenever something could read them (a queue, a judging sample, any other event)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import LEARN_BURST, LEARN_PER_S, SAMPLE_BATCH, AdmissionController
from proxy.core.decisions import Admit, Observed, Outcome
from proxy.core.service_model import ServiceModel, ServiceModels
from proxy.policy.admission import Route
from tests.core.test_admission import make_policy, ticket

_samples = st.lists(
    st.tuples(
        st.integers(0, 8000),  # prompt tokens
        st.integers(0, 2000),  # output tokens
        st.floats(0.05, 60_000.0),  # ms
        st.one_of(st.none(), st.floats(0.1, 60_000.0)),  # expected at arrival
    ),
    max_size=80,
)


def _state(m: ServiceModel) -> tuple:
    return (m.coefficients, m.error, m.samples, m._R, m._r, m._seen, m._ref, m._scale, m._min_ms, m._pending)


@settings(max_examples=60, deadline=None)
@given(_samples)
def test_observe_many_is_observe_one_by_one_bit_for_bit(samples) -> None:
    one, many = ServiceModel(50.0, 0.1, 20.0), ServiceModel(50.0, 0.1, 20.0)
    for s in samples:
        one.observe(*s)
    many.observe_many(samples)
    assert _state(one) == _state(many)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["/a", "/b", "/gone"]),
            st.integers(0, 4000),
            st.integers(0, 1000),
            st.floats(1.0, 5000.0),
            st.floats(0.5, 5000.0),
            st.one_of(st.none(), st.integers(0, 4000)),
            st.one_of(st.none(), st.integers(0, 1000)),
            st.floats(0.0, 100.0),
        ),
        max_size=50,
    )
)
def test_learn_many_is_learn_one_by_one(samples) -> None:
    routes = [Route(path_prefix="/a", kind="chat"), Route(path_prefix="/b", kind="embeddings")]
    one, many = ServiceModels(), ServiceModels()
    for m in (one, many):
        m.configure(routes, 500, 5.0)
    for s in samples:
        one.learn(*s)
    many.learn_many(samples)
    for route in ("/a", "/b"):
        a, b = one._models[route], many._models[route]
        assert _state(a) == _state(b)
        assert a.fill.statistics() == b.fill.statistics() and a.fill.route == b.fill.route


def _served(ctl: AdmissionController, n: int, now: float) -> float:
    """n requests one after another, nobody queued: each admitted and released SUCCESS."""
    for _ in range(n):
        d = ctl.arrive(ticket(expected_ms=10.0), now)
        assert isinstance(d, Admit)
        now += 0.01
        ctl.release(d.lease, now, Outcome.SUCCESS, 10.0, Observed(None, None))
    return now


def test_quiet_releases_fold_every_batch_and_statistics_folds_the_rest() -> None:
    ctl = AdmissionController(make_policy(limit=4, kind="gradient"), rng=random.Random(0))
    model = ctl.models._models["/"]
    warm = model._warmup
    now = _served(ctl, warm, 1.0)
    assert model.samples == warm  # in warm-up every sample is folded at once: off the priors fast
    now = _served(ctl, SAMPLE_BATCH - 1, now)
    assert model.samples == warm  # past it: taken, not yet folded
    now = _served(ctl, 1, now)
    assert model.samples == warm + SAMPLE_BATCH and ctl.capacity.limits[0].samples == warm + SAMPLE_BATCH
    _served(ctl, 3, now)
    assert model.samples == warm + SAMPLE_BATCH
    ctl.statistics()  # introspection reads the current state
    assert model.samples == warm + SAMPLE_BATCH + 3


def test_a_queue_or_another_outcome_folds_at_once() -> None:
    ctl = AdmissionController(make_policy(limit=1), rng=random.Random(0))
    model = ctl.models._models["/"]
    warm = model._warmup
    now = _served(ctl, warm + 2, 1.0)
    assert model.samples == warm
    first = ctl.arrive(ticket(expected_ms=10.0), now)
    assert isinstance(first, Admit)
    ctl.arrive(ticket(expected_ms=10.0), now)  # the limit is 1: this one queues
    assert model.samples == warm + 2  # an arrival that is not quiet (no room) folded what was taken
    ctl.release(first.lease, now + 0.01, Outcome.SUCCESS, 10.0)
    assert model.samples == warm + 3  # released with a queue: folded at once
    ctl = AdmissionController(make_policy(limit=4, kind="gradient"), rng=random.Random(0))
    now = _served(ctl, warm + 3, 1.0)
    d = ctl.arrive(ticket(expected_ms=10.0), now)
    ctl.release(d.lease, now + 0.01, Outcome.DROPPED, 10.0)
    assert ctl.capacity.limits[0].samples == warm + 4  # the three successes, then the drop, in order


def _served_at(ctl: AdmissionController, n: int, now: float, per_s: float) -> float:
    """n requests at `per_s` a second, nobody queued, each admitted and released SUCCESS."""
    for _ in range(n):
        d = ctl.arrive(ticket(expected_ms=10.0), now)
        assert isinstance(d, Admit)
        now += 1.0 / per_s
        ctl.release(d.lease, now, Outcome.SUCCESS, 10.0, Observed(None, None))
    return now


def test_below_the_learning_rate_every_sample_is_learned() -> None:
    ctl = AdmissionController(make_policy(limit=4), rng=random.Random(0))
    _served_at(ctl, 300, 1.0, LEARN_PER_S / 2)
    ctl.flush()
    assert ctl.models._models["/"].samples == 300 and ctl.counts["not_learned"] == 0


def test_above_it_the_models_learn_at_that_rate_and_the_limits_from_every_sample() -> None:
    ctl = AdmissionController(make_policy(limit=4, kind="gradient"), rng=random.Random(0))
    model = ctl.models._models["/"]
    warm = model._warmup
    now = _served_at(ctl, warm, 1.0, 10.0)  # warm-up: every sample, whatever the rate
    assert model.samples == warm
    seconds, rate = 2.0, 10 * LEARN_PER_S
    _served_at(ctl, int(seconds * rate), now + 1.0, rate)
    ctl.flush()
    learned = model.samples - warm
    # The credit starts full after the idle second (LEARN_BURST), then refills at LEARN_PER_S.
    assert abs(learned - (LEARN_BURST + seconds * LEARN_PER_S)) <= 2
    assert ctl.counts["not_learned"] == int(seconds * rate) - learned
    assert ctl.capacity.limits[0].samples == warm + int(seconds * rate)  # the limit takes every one


def test_judging_samples_are_learned_even_with_no_credit_left() -> None:
    ctl = AdmissionController(make_policy(limit=4), rng=random.Random(0))
    model = ctl.models._models["/"]
    warm = model._warmup
    assert warm > LEARN_BURST  # more warm-up samples than the credit holds
    _served_at(ctl, warm + 100, 1.0, 100 * LEARN_PER_S)
    ctl.flush()
    assert model.samples >= warm  # every warm-up sample learned, whatever the rate
    assert model.samples < warm + 100 and ctl.counts["not_learned"] == warm + 100 - model.samples
