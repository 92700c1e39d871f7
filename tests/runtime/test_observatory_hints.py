"""The timeout hint's response fields, made once per latency key and refresh (Observatory.hint_fields)."""

from __future__ import annotations

from proxy.core import wire
from proxy.policy.shedding import Latency
from proxy.runtime.observe import Observatory

KEY = ("/v1/chat/completions", 7)


def _hint(fields: tuple[tuple[bytes, bytes], tuple[bytes, bytes]]) -> int:
    (name, value), (key_name, key_value) = fields
    assert name == wire.TIMEOUT_HINT_MS.encode() and key_name == wire.TIMEOUT_HINT_KEY.encode()
    assert key_value == wire.hint_key(*KEY)
    return int(value)


def _observatory(**latency) -> Observatory:
    return Observatory(Latency(min_samples=5, timeout_hint_factor=2.0, timeout_hint_min_ms=1, **latency))


def _record(obs: Observatory, ms: float, n: int, now: float) -> None:
    for _ in range(n):
        obs._end_to_end.record(KEY, ms, now)


def test_too_few_samples_answer_each_request_its_own_fallback() -> None:
    obs = _observatory()
    assert _hint(obs.hint_fields(KEY, 1.0, 100.0)) == 200
    assert _hint(obs.hint_fields(KEY, 1.0, 300.0)) == 600  # not kept: the fallback is the request's own


def test_a_p99_hint_is_reused_until_the_refresh_and_then_follows_the_samples() -> None:
    obs = _observatory(quantile_refresh_ms=250)
    _record(obs, 100.0, 20, 1.0)
    first = _hint(obs.hint_fields(KEY, 1.0, 5.0))
    assert 190 <= first <= 210  # 2 x a p99 of ~100 ms (log buckets: 2 % relative error)
    _record(obs, 1000.0, 200, 1.1)
    assert _hint(obs.hint_fields(KEY, 1.2, 5.0)) == first  # within the refresh: the same fields
    assert 1900 <= _hint(obs.hint_fields(KEY, 1.3, 5.0)) <= 2100  # past it: the new p99


def test_with_no_refresh_every_request_reads_the_p99() -> None:
    obs = _observatory(quantile_refresh_ms=0)
    _record(obs, 100.0, 20, 1.0)
    assert 190 <= _hint(obs.hint_fields(KEY, 1.0, 5.0)) <= 210
    _record(obs, 1000.0, 200, 1.0)
    assert 1900 <= _hint(obs.hint_fields(KEY, 1.0, 5.0)) <= 2100


def test_the_kept_hints_are_bounded_by_max_keys() -> None:
    obs = _observatory(max_keys=4)
    for bucket in range(40):
        key = ("/r", bucket)
        for _ in range(5):
            obs._end_to_end.record(key, 50.0, 1.0)
        obs.hint_fields(key, 1.0, 5.0)
        assert len(obs._hints) <= 4
