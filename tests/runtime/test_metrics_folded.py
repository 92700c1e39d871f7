"""Folded metrics (proxy/metrics.py Tally): plain numbers on the hot path, Prometheus families at scrape."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from proxy.metrics import LATENCY_BUCKETS, SPECS, Metrics


def _samples(registry: CollectorRegistry, name: str) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        if family.name == name
        for s in family.samples
    }


def test_a_folded_histogram_scrapes_exactly_as_a_prometheus_one():
    metrics = Metrics()
    reference = CollectorRegistry()
    hist = Histogram("rampmeter_queue_wait_seconds", "x", ("class",), buckets=LATENCY_BUCKETS, registry=reference)
    for value in (0.0, 0.0005, 0.0007, 0.03, 1.0, 500.0):  # bucket edges included: le is inclusive
        metrics.queue_wait_seconds.labels("batch").observe(value)
        hist.labels("batch").observe(value)
    name = "rampmeter_queue_wait_seconds"
    assert _samples(metrics.registry, name) == _samples(reference, name)
    assert len(_samples(reference, name)) == len(LATENCY_BUCKETS) + 3  # buckets, +Inf, count, sum


def test_folded_counters_keep_their_names_labels_and_help():
    metrics = Metrics()
    metrics.rejections.labels("", "draining").inc()
    metrics.rejections.labels("batch", "queue_full").inc(2)
    assert metrics.rejections.labels("batch", "queue_full") is metrics.rejections.labels("batch", "queue_full")
    reg = metrics.registry
    assert reg.get_sample_value("rampmeter_rejections_total", {"class": "batch", "reason": "queue_full"}) == 2
    assert reg.get_sample_value("rampmeter_rejections_total", {"class": "", "reason": "draining"}) == 1
    text = generate_latest(reg).decode()
    for spec in SPECS:
        if spec.folded:
            assert f"# HELP rampmeter_{spec.name.removesuffix('_total')}" in text
    with pytest.raises(ValueError):
        metrics.rejections.labels("batch")  # a label short
