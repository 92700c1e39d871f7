"""[shedding], [tenants], [latency]: defaults, ranges, cross-field rules, and the core objects built from them."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from proxy.policy.schema import Policy  # isort: skip  (schema first: it composes the feature tables)
from proxy.core.shedding import LoadSnapshot
from proxy.core.wire import Reason
from proxy.errors import PolicyError
from proxy.policy import shedding as sp
from proxy.policy.load import parse_policy


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.toml")
    return info.value.errors


def test_defaults():
    policy = parse_policy("")
    assert policy.shedding == sp.Shedding()
    assert policy.shedding.rules == ["queue_length", "gpu_memory", "codel"]  # saturation is opt-in
    assert policy.tenants.enabled is False
    assert policy.latency.timeout_hint_factor == 2.5


def test_every_field_is_documented_and_the_sections_are_in_the_policy_schema():
    import msgspec

    _, components = msgspec.json.schema_components([Policy])
    for section in (sp.Shedding, sp.Tenants, sp.Latency):
        for name, info in components[section.__name__]["properties"].items():
            assert info.get("description"), f"{section.__name__}.{name} has no description"
    top = components["Policy"]["properties"]
    assert {"shedding", "tenants", "latency"} <= set(top)


def test_values_are_read():
    policy = parse_policy(
        '[shedding]\nrules = ["codel"]\ncodel_target_ms = 20\n'
        "[tenants]\nenabled = true\nrate_per_s = 5\nburst = 10\n"
        "[latency]\nwindow_s = 30\nsub_windows = 3\n"
    )
    assert (policy.shedding.rules, policy.shedding.codel_target_ms) == (["codel"], 20.0)
    assert (policy.tenants.rate_per_s, policy.tenants.burst) == (5.0, 10)
    assert policy.latency.window_s == 30.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[shedding]\ngpu_memory_high_water = 1.5\n",
            "p.toml:2: shedding.gpu_memory_high_water: Expected `float` <= 1",
        ),
        ('[shedding]\nrules = ["nope"]\n', "shedding.rules[0]: Invalid enum value 'nope'"),
        ("[shedding]\ncodel_target = 5\n", "p.toml:2: shedding.codel_target: unknown key (allowed here: rules,"),
        ("[tenants]\nburst = 0\n", "p.toml:2: tenants.burst: Expected `int` >= 1"),
        ("[latency]\nsub_windows = 0\n", "p.toml:2: latency.sub_windows: Expected `int` >= 1"),
        (
            "[shedding]\nretry_after_min_ms = 5000\nretry_after_max_ms = 1000\n",
            "shedding: retry_after_min_ms must be <= retry_after_max_ms",
        ),
        ('[shedding]\nrules = ["codel", "codel"]\n', "shedding: rules lists a rule twice"),
        (
            "[latency]\ntimeout_hint_min_ms = 9000\ntimeout_hint_max_ms = 10\n",
            "latency: timeout_hint_min_ms must be <= timeout_hint_max_ms",
        ),
        ("[latency]\nwindow_s = 0.5\nsub_windows = 10\n", "latency: window_s / sub_windows must be >= 0.1 s"),
    ],
)
def test_bad_values_are_named(text, message):
    (error,) = errors_of(text)
    assert message in error, error


def test_shedder_from_policy_applies_class_steps_and_rules():
    section = parse_policy(
        '[shedding]\nrules = ["queue_length"]\nmax_queued_requests = 100\nclass_step_pct = 50\n'
    ).shedding
    shedder = sp.shedder(section, n_classes=3, rng=random.Random(1))
    assert shedder.codels is None
    load = LoadSnapshot(queued_by_class=(0, 0, 30), gpu_memory_fraction=1.0, drain_rate_per_s=10.0)
    assert shedder.check(load, 1, 0.0) is None  # gpu_memory rule is off
    verdict = shedder.check(load, 2, 0.0)  # cap 25 for rank 2
    assert verdict.reason is Reason.QUEUE_FULL
    assert 100 <= verdict.retry_after_ms <= 30_000


def test_all_rules_off():
    section = parse_policy("[shedding]\nrules = []\n").shedding
    shedder = sp.shedder(section, n_classes=2, rng=random.Random(1))
    load = LoadSnapshot(
        queued_by_class=(10**6, 10**6), inflight=9, limit=9, queue_growth_per_s=1e3, gpu_memory_fraction=1.0
    )
    assert shedder.check(load, 1, 0.0) is None


def test_tenant_quota_only_when_enabled():
    assert sp.tenant_quota(sp.Tenants()) is None
    quota = sp.tenant_quota(sp.Tenants(enabled=True, rate_per_s=1, burst=2, max_tenants=3))
    assert (quota.burst, quota.max_tenants) == (2, 3)


def test_latency_family_from_policy():
    family = sp.latency_family(sp.Latency(min_samples=2, max_keys=7, relative_error_pct=1.0))
    family.record("k", 100.0, now=0.0)
    assert family.quantile("k", 0.99, now=0.0) is None
    family.record("k", 100.0, now=0.0)
    assert family.quantile("k", 0.99, now=0.0) == pytest.approx(100.0, rel=0.01)
    assert family.max_keys == 7


def test_importing_the_section_module_first_works():
    """schema imports this module at its end and this module subclasses schema.Section."""
    code = "import proxy.policy.shedding as s; from proxy.policy.load import parse_policy; print(parse_policy('').shedding.rules)"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "queue_length" in out.stdout
