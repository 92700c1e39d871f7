"""Admission policy sections: defaults, every bound names its key, cross-field rules."""

from __future__ import annotations

import json

import msgspec
import msgspec.inspect as mi
import pytest

from proxy.errors import PolicyError
from proxy.policy.admission import ClassPolicy, Limits, Route, Scheduling
from proxy.policy.load import parse_policy

# Each section, the TOML that opens it, and how its keys are named in errors.
SECTIONS = [
    (Scheduling, "[scheduling]\n", "scheduling."),
    (ClassPolicy, "[classes.interactive]\n", "classes"),
    (Route, '[[routes]]\npath_prefix = "/x"\n', "routes[0]."),
    (Limits, "[limits]\n", "limits."),
]


def _unwrap(t):
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _description(t) -> str:
    while isinstance(t, mi.Metadata):
        if (t.extra_json_schema or {}).get("description"):
            return t.extra_json_schema["description"]
        t = t.type
    return ""


def violations(field: mi.Field) -> list[str]:
    """TOML values that break the field's declared range or type."""
    t = _unwrap(field.type)
    out = []
    if isinstance(t, (mi.IntType, mi.FloatType)):
        fmt = (lambda v: str(int(v))) if isinstance(t, mi.IntType) else (lambda v: repr(float(v)))
        if t.ge is not None:
            out.append(fmt(t.ge - 1))
        if t.gt is not None:
            out.append(fmt(t.gt))
        if t.le is not None:
            out.append(fmt(t.le + 1))
        if t.lt is not None:
            out.append(fmt(t.lt))
    elif isinstance(t, mi.LiteralType):
        out.append('"no-such-choice"')
    elif isinstance(t, mi.StrType):
        if t.pattern:
            out.append('"no slash"')
        if t.max_length:
            out.append(json.dumps("/" + "x" * t.max_length))
    elif isinstance(t, mi.DictType):
        out += ['{ "Not A Class!" = 1 }', "{ realtime = -1 }"]
    return out


CASES = [
    pytest.param(
        header.replace('path_prefix = "/x"\n', "") if f.name == "path_prefix" else header,
        prefix,
        f.name,
        value,
        id=f"{cls.__name__}.{f.name}[{i}]",
    )
    for cls, header, prefix in SECTIONS
    for f in mi.type_info(cls).fields
    for i, value in enumerate(violations(f))
]


def test_there_are_bounds_to_test():
    assert len(CASES) > 40


@pytest.mark.parametrize("header, prefix, key, value", CASES)
def test_every_bound_produces_an_error_naming_the_key(header, prefix, key, value):
    text = f"{header}{key} = {value}\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    message = str(info.value)
    assert prefix in message and key in message, message


@pytest.mark.parametrize("cls", [Scheduling, ClassPolicy, Route, Limits])
def test_every_field_is_described(cls):
    for f in mi.type_info(cls).fields:
        assert _description(f.type), f"{cls.__name__}.{f.name} has no description"


def test_defaults_suit_an_llm_pod():
    p = parse_policy("")
    assert list(p.classes) == ["realtime", "interactive", "batch"]
    assert p.scheduling.default_class in p.classes and p.scheduling.order == "sjf"
    assert p.classes["realtime"].priority < p.classes["interactive"].priority < p.classes["batch"].priority
    assert all(c.on_unmeetable == "reject" for c in p.classes.values())  # shed early, not rot in a queue
    assert [r.kind for r in p.routes] == ["chat", "completions", "embeddings", "fixed"]
    assert p.limits.min_limit <= p.limits.initial_limit <= p.limits.max_limit
    assert sum(p.scheduling.reserved_slots.values()) < p.limits.min_limit


def test_reservations_above_the_limit_load_and_are_scaled_down_at_runtime():
    # issue 12: a policy reserving 2 realtime slots failed `policy check` with a limit of 1
    p = parse_policy(
        "[scheduling]\nreserved_slots = { realtime = 2 }\n[limits]\nkind = 'fixed'\ninitial_limit = 1\nmin_limit = 1\n"
    )
    assert p.scheduling.reserved_slots == {"realtime": 2} and p.limits.initial_limit == 1
    q = parse_policy('[gpu]\nupstream_metrics_path = "/metrics"\n[limits]\nkind = "engine_queue"\n')
    assert q.limits.kind == "engine_queue"


def test_a_full_admission_policy_loads():
    p = parse_policy(
        """
[scheduling]
order = "fcfs"
class_mode = "weighted"
default_class = "standard"
reserved_slots = { premium = 2 }

[classes.premium]
priority = 0
weight = 5
max_queue_wait_ms = 200
on_unmeetable = "reject"

[classes.standard]
weight = 1
default_timeout_ms = 20000

[[routes]]
path_prefix = "/v1/chat/completions"
kind = "chat"
chars_per_token = 3.5
ms_per_output_token = 12.0

[limits]
kind = "gradient"
unit = "tokens"
initial_limit = 200000
min_limit = 20000
max_limit = 1000000
target_latency_ms = 25
"""
    )
    assert p.scheduling.reserved_slots == {"premium": 2} and p.classes["premium"].weight == 5
    assert p.limits.unit == "tokens" and p.routes[0].chars_per_token == 3.5


@pytest.mark.parametrize(
    "text, key",
    [
        ('[scheduling]\ndefault_class = "gold"\n', "scheduling.default_class"),
        ("[scheduling]\nreserved_slots = { gold = 1 }\n", "scheduling.reserved_slots.gold"),
        ('[limits]\nkind = "engine_queue"\n', "limits.kind"),  # no gauges to follow
        (
            '[gpu]\nupstream_metrics_path = "/metrics"\n[limits]\nkind = "engine_queue"\nunit = "tokens"\n',
            "limits.kind",
        ),
        ("[limits]\ninitial_limit = 2\n", "limits.initial_limit"),
        ("[limits]\nmax_limit = 10\n", "limits.initial_limit"),
        (
            "[classes.interactive]\ndefault_timeout_ms = 9000\nmax_timeout_ms = 1000\n",
            "classes.interactive.default_timeout_ms",
        ),
        (
            '[[routes]]\npath_prefix = "/a"\n[[routes]]\npath_prefix = "/a"\n',
            "routes[1].path_prefix",
        ),
        (
            "[classes.gold]\npriority = 0\n",
            "scheduling.default_class",
        ),  # [classes] replaces the defaults
    ],
)
def test_cross_field_rules_name_the_key(text, key):
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    assert any(key in line for line in info.value.errors), info.value.errors


def test_unknown_keys_are_errors_that_name_the_key():
    with pytest.raises(PolicyError) as info:
        parse_policy("[limits]\nlimit_kind = 'fixed'\n")
    assert "limits.limit_kind" in str(info.value) and "allowed here" in str(info.value)


def test_sections_are_frozen():
    with pytest.raises(AttributeError):
        parse_policy("").limits.kind = "fixed"  # type: ignore[misc]
    assert msgspec.json.decode(msgspec.json.encode(parse_policy("").classes), type=dict)
