"""The one pass over a request's headers (proxy/runtime/fields.py): which occurrence each reader gets."""

from __future__ import annotations

from proxy.runtime.fields import Fields


def test_read_keeps_what_each_former_scan_kept() -> None:
    headers = [
        (b"host", b"x"),
        (b"x-request-id", b"first-id"),
        (b"x-priority", b"batch"),
        (b"content-type", b"application/grpc"),
        (b"idempotency-key", b"k1"),
        (b"x-request-id", b"second-id"),
        (b"x-priority", b"realtime"),
        (b"content-type", b"application/json"),
        (b"idempotency-key", b"k2"),
        (b"x-request-timeout-ms", b"250"),
        (b"x-cost-hint", b"7"),
        (b"x-tenant", b"t"),
        (b"authorization", b"Bearer a"),
    ]
    f = Fields.read(headers)
    # first occurrence (header_value's rule): request id, content type, idempotency key
    assert (f.request_id, f.request_id_at) == (b"first-id", 1)
    assert f.content_type == b"application/grpc"
    assert f.idempotency_key == b"k1"
    # last occurrence (classify's former loop): the classification fields
    assert f.priority == b"realtime"
    assert (f.timeout, f.grpc_timeout, f.cost_hint) == (b"250", None, b"7")
    assert (f.tenant, f.authorization) == (b"t", b"Bearer a")
    assert f.has_budget


def test_read_without_any_field_of_interest() -> None:
    f = Fields.read([(b"host", b"x"), (b"accept", b"*/*")])
    assert f.request_id is None and f.request_id_at == -1
    assert f.content_type is None and f.idempotency_key is None and f.priority is None
    assert not f.has_budget
    assert not Fields.read([(b"grpc-timeout", b"5S")]).timeout
    assert Fields.read([(b"grpc-timeout", b"5S")]).has_budget
