"""/admin/stats shows the service-model coefficients the prediction uses, not the raw least-squares fit."""

from __future__ import annotations

import random

import pytest

from proxy.core.service_model import ServiceModel


def test_statistics_are_the_coefficients_predict_ms_uses():
    model = ServiceModel(20.0, 0.1, 20.0, 0.5, prior_samples=0.01)
    rng = random.Random(1)
    for _ in range(300):  # longer prompts answer faster: a least-squares slope below zero
        prompt, output = rng.randint(10, 4000), rng.randint(1, 50)
        model.observe(prompt, output, max(1.0, 200 - 0.05 * prompt + 5 * output + rng.uniform(-5, 5)))
    assert model.coefficients[1] == 0.0  # the fit itself is held to physical ranges, not only its display
    stats = model.statistics()
    assert stats["ms_per_prompt_token"] >= 0 and stats["ms_per_output_token"] >= 0
    for prompt, output in ((0, 0), (100, 10), (4000, 50)):
        shown = stats["base_ms"] + stats["ms_per_prompt_token"] * prompt + stats["ms_per_output_token"] * output
        assert model.predict_ms(prompt, output) == pytest.approx(max(0.1, shown))
