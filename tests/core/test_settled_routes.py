"""ServiceModels.settled: the routes whose per-request questions the controller answers without asking
(judged, not warming, no floor, no probe). It must never say settled where asking would say otherwise."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.service_model import ServiceModels
from proxy.policy.admission import Route

ROUTES = [Route(path_prefix="/a", kind="chat"), Route(path_prefix="/b", kind="embeddings")]
SHAPES = [(10, 16), (1500, 512), (3000, 0)]

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("learn"), st.sampled_from(["/a", "/b"]), st.sampled_from(SHAPES), st.floats(1.0, 5000.0)),
        st.tuples(st.just("cut"), st.sampled_from(["/a", "/b"]), st.sampled_from(SHAPES), st.floats(1.0, 60000.0)),
        st.tuples(st.just("seed"), st.sampled_from(["/a", "/b"]), st.sampled_from(SHAPES), st.floats(1.0, 5000.0)),
        st.tuples(st.just("reload"), st.just(""), st.just((0, 0)), st.just(0.0)),
    ),
    max_size=60,
)


def _agrees(models: ServiceModels, now: float) -> None:
    for route in models.settled:
        assert models.judged(route) and not models.warming(route)
        for prompt, output in SHAPES:
            assert not models.floored(route, prompt, output)
            assert models.floor_ms(route, prompt, output, now) == 0.0
            assert not models.probe(route, prompt, output, 1, now + 1.0, now)
            with_now = models.expected_ms(route, prompt, output, 0.0, now)
            assert with_now == models.expected_ms(route, prompt, output, 0.0)


@settings(max_examples=80, deadline=None)
@given(_ops, st.integers(1, 30))
def test_a_settled_route_answers_as_asking_would(ops, warmup) -> None:
    models = ServiceModels()
    models.configure(ROUTES, 500, 5.0)
    for m in models._models.values():
        m._warmup = warmup
    now = 1.0
    for op, route, (prompt, output), ms in ops:
        now += 0.5
        if op == "learn":
            models.learn(route, prompt, output, 100.0, ms, None, None, now)
        elif op == "cut":
            models.censored(route, prompt, output, ms, now)
        elif op == "seed":
            models.seed(route, prompt, output, ms, now)
        else:
            models.configure(ROUTES, 500, 5.0)  # the same routes: models kept, settled recomputed
        _agrees(models, now)


def test_a_route_settles_after_warm_up_and_leaves_at_its_first_informative_cut() -> None:
    models = ServiceModels()
    models.configure(ROUTES, 500, 5.0)
    warm = models._models["/a"]._warmup
    for i in range(warm):
        assert "/a" not in models.settled
        models.learn("/a", 10, 16, 100.0, 100.0, None, None, float(i))
    assert "/a" in models.settled and "/b" not in models.settled
    assert models.censored("/a", 10, 16, 60_000.0, 100.0)  # far past the prediction: a floor
    assert "/a" not in models.settled
