"""Service-time model: priors, convergence with outliers, drift, robustness (synthetic data, seeded)."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.service_model import ServiceModel


def synthetic(rng: random.Random, a: float, b: float, c: float, outliers: float = 0.05):
    """(prompt, output, ms) with +-10% noise and a share of 5-50x stalls."""
    p, o = rng.randint(10, 4000), rng.randint(1, 1000)
    ms = (a + b * p + c * o) * rng.uniform(0.9, 1.1)
    if rng.random() < outliers:
        ms *= rng.uniform(5, 50)
    return p, o, ms


def rel_err(model: ServiceModel, a: float, b: float, c: float, rng: random.Random) -> float:
    worst = 0.0
    for _ in range(200):
        p, o = rng.randint(10, 4000), rng.randint(1, 1000)
        truth = a + b * p + c * o
        worst = max(worst, abs(model.predict_ms(p, o) - truth) / truth)
    return worst


def test_priors_hold_before_any_sample():
    m = ServiceModel(20.0, 0.1, 20.0, output_fill_ratio=0.5)
    assert m.predict_ms(1000, 100) == 20.0 + 100.0 + 2000.0
    assert m.expected_ms(1000, 100) == 20.0 + 100.0 + 1000.0  # half of max_tokens expected
    assert m.statistics()["samples"] == 0 and m.statistics()["mean_abs_relative_error"] is None


def test_converges_on_noisy_data_with_outliers():
    rng = random.Random(1)
    m = ServiceModel(20.0, 0.1, 20.0, memory_samples=500)
    for _ in range(3000):
        m.observe(*synthetic(rng, 50.0, 0.3, 30.0))
    _, b, c = m.coefficients
    assert abs(b - 0.3) / 0.3 < 0.1 and abs(c - 30.0) / 30.0 < 0.05
    assert rel_err(m, 50.0, 0.3, 30.0, random.Random(2)) < 0.1


def test_tracks_a_drift():
    rng = random.Random(3)
    m = ServiceModel(20.0, 0.1, 20.0, memory_samples=300)
    for _ in range(2000):
        m.observe(*synthetic(rng, 50.0, 0.3, 30.0))
    for _ in range(2000):  # the pod got slower (longer batches, a smaller GPU)
        m.observe(*synthetic(rng, 80.0, 0.2, 45.0))
    assert rel_err(m, 80.0, 0.2, 45.0, random.Random(4)) < 0.1


def test_a_single_huge_outlier_barely_moves_a_converged_model():
    rng = random.Random(5)
    m = ServiceModel(20.0, 0.1, 20.0)
    for _ in range(2000):
        m.observe(*synthetic(rng, 50.0, 0.3, 30.0, outliers=0.0))
    before = m.predict_ms(1000, 200)
    m.observe(1000, 200, before * 100)  # a 100x stall
    assert abs(m.predict_ms(1000, 200) - before) / before < 0.02


def test_output_fill_ratio_is_learned():
    m = ServiceModel(0.0, 0.0, 10.0, output_fill_ratio=1.0, memory_samples=100)
    for _ in range(500):
        m.observe_output(requested_tokens=400, generated_tokens=100)
    assert abs(m.output_fill_ratio - 0.25) < 0.01
    m.observe_output(0, 50)  # nothing requested: no information
    assert abs(m.output_fill_ratio - 0.25) < 0.01


def test_recent_error_falls_as_the_model_learns():
    rng = random.Random(6)
    m = ServiceModel(1.0, 0.0, 1.0, memory_samples=200)
    for _ in range(50):
        m.observe(*synthetic(rng, 50.0, 0.3, 30.0, outliers=0.0))
    early = m.error
    for _ in range(1500):
        m.observe(*synthetic(rng, 50.0, 0.3, 30.0, outliers=0.0))
    assert m.error < early and m.error < 0.1
    assert "ServiceModel" in repr(m) and m.statistics()["samples"] == 1550


@given(
    st.lists(
        st.tuples(st.integers(0, 100_000), st.integers(0, 10_000), st.floats(0.0, 1e7)), max_size=60
    ),
    st.integers(0, 100_000),
    st.integers(0, 10_000),
)
def test_predictions_stay_finite_and_monotone_in_tokens(samples, p, o):
    m = ServiceModel(20.0, 0.1, 20.0, memory_samples=20)
    for sp, so, ms in samples:
        m.observe(sp, so, ms)
    base = m.predict_ms(p, o)
    assert math.isfinite(base) and base > 0
    assert m.predict_ms(p + 100, o) >= base and m.predict_ms(p, o + 10) >= base
