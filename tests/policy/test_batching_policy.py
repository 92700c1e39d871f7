"""[batching] and [[batching.routes]]: off by default, strict keys, ranges and cross-field rules; the docs' example parses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy.load import parse_policy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "batching.md"


def test_nothing_is_batched_by_default():
    assert parse_policy("").batching.routes == []


def test_a_route_takes_its_defaults():
    (route,) = parse_policy('[[batching.routes]]\npath = "/v1/embeddings"\n').batching.routes
    assert (route.kind, route.max_batch_items, route.max_wait_ms, route.adaptive) == ("embeddings", 32, 10.0, False)
    assert route.length_buckets == [64, 256] and route.match_headers == ["authorization"]
    assert (route.max_concurrent_batches, route.on_batch_error) == (1, "fail_all")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[batching.routes]]\npath = "/v1/embeddings"\nmax_batch_size = 8\n', "max_batch_size"),
        ('[[batching.routes]]\npath = "v1/embeddings"\n', "batching.routes[0].path"),
        ('[[batching.routes]]\npath = "/v1/embeddings?x=1"\n', "batching.routes[0].path"),
        ('[[batching.routes]]\npath = "/x"\nkind = "chat"\n', "batching.routes[0].kind"),
        ('[[batching.routes]]\npath = "/x"\nmax_batch_items = 0\n', "batching.routes[0].max_batch_items"),
        ('[[batching.routes]]\npath = "/x"\nmax_wait_ms = -1\n', "batching.routes[0].max_wait_ms"),
        ('[[batching.routes]]\npath = "/x"\nlength_buckets = [256, 64]\n', "length_buckets: edges must increase"),
        ('[[batching.routes]]\npath = "/x"\nmatch_headers = ["Authorization"]\n', "match_headers"),
        (
            '[[batching.routes]]\npath = "/x"\n[[batching.routes]]\npath = "/x"\n',
            "batching.routes[1].path: '/x' repeats",
        ),
        ('[[batching.routes]]\npath = "/x"\non_batch_error = "retry"\n', "on_batch_error"),
    ],
)
def test_bad_values_are_refused_naming_the_key(text, message):
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    assert message in str(info.value)


def test_the_example_in_docs_batching_md_is_a_valid_policy():
    text = DOCS.read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", text, flags=re.S)[:1]
    routes = parse_policy(example).batching.routes
    assert [r.path for r in routes] == ["/v1/embeddings", "/v1/rerank"]
