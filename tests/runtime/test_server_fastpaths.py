"""The data path's fast paths keep the semantics of what they replace.

h1write: writes exactly the fields h11's validating constructors accepted (the
check that keeps a CR LF in a value from adding fields), and the heads it builds
are what h11 parses back. sockio: trio's error types, cancellation on entry,
waiting when nothing is there, and a forced yield after a streak of instant
operations.
"""

from __future__ import annotations

import h11
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.http import h1write, sockio

# Bytes that matter to the field grammar: token characters, separators, spaces,
# controls (NUL, CR, LF, others) and obs-text.
_ALPHABET = b"aZ09-_.!~ :;,\t\r\n\x00\x01\x7f\x80\xff"
_field = st.binary(max_size=6).map(lambda b: bytes(_ALPHABET[x % len(_ALPHABET)] for x in b))


def _h11_accepts(headers: list[tuple[bytes, bytes]]) -> bool:
    try:
        h11.Response(status_code=200, headers=headers, reason=b"OK")
    except h11.LocalProtocolError:
        return False
    return True


def _we_accept(headers: list[tuple[bytes, bytes]]) -> bool:
    try:
        h1write.check_fields(headers)
    except h1write.FieldError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_field, _field), max_size=4))
def test_check_fields_agrees_with_h11_validation(headers):
    expected = _h11_accepts(headers)
    assert _we_accept(headers) is expected
    assert _we_accept(headers) is expected  # second time through the cache of accepted pairs


def test_a_value_that_would_add_a_field_is_refused():
    with pytest.raises(h1write.FieldError, match="illegal header value"):
        h1write.response_head(200, [(b"x-a", b"b\r\nset-cookie: evil")])
    with pytest.raises(h1write.FieldError, match="bytes"):
        h1write.response_head(200, [("X-Str", "text")])
    with pytest.raises(h1write.FieldError, match="request line"):
        h1write.request_head(b"GET", b"/a b", [(b"host", b"x")])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_field, _field), max_size=4).filter(_h11_accepts), st.sampled_from([200, 201, 404, 503]))
def test_heads_we_write_parse_back_in_h11_as_written(headers, status):
    headers = [(b"x-" + k, v) for k, v in headers]  # stay clear of framing fields
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=b"GET", target=b"/", headers=[(b"host", b"x")]))
    conn.receive_data(h1write.response_head(status, [*headers, (b"content-length", b"0")]))
    event = conn.next_event()
    assert event.status_code == status
    assert list(event.headers) == [(k.lower(), v) for k, v in headers] + [(b"content-length", b"0")]
    server = h11.Connection(h11.SERVER)
    server.receive_data(h1write.request_head(b"POST", b"/v1/x?y=1", [(b"host", b"h"), *headers]))
    request = server.next_event()
    assert (request.method, request.target) == (b"POST", b"/v1/x?y=1")
    assert list(request.headers) == [(b"host", b"h")] + [(k.lower(), v) for k, v in headers]


async def test_receive_waits_then_reads_and_sees_eof():
    a, b = trio.socket.socketpair()
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def reader() -> None:
            got.append(await sockio.receive(b, 100, wait_first=True))

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # nothing there: it waits
        await sockio.send_all(a, b"hello")
    assert got == [b"hello"]
    a.close()
    assert await sockio.receive(b, 100, wait_first=False) == b""  # EOF
    b.close()


async def test_errors_are_trios():
    a, b = trio.socket.socketpair()
    a.close()
    for op in (
        lambda: sockio.receive(a, 10, True),
        lambda: sockio.receive(a, 10, False),
        lambda: sockio.send_all(a, b"x"),
    ):
        with pytest.raises(trio.ClosedResourceError):
            await op()
    b.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the peer is gone: EPIPE / ECONNRESET, sooner or later
            await sockio.send_all(b, b"x" * 4096)
    b.close()


async def test_another_task_closing_the_socket_wakes_a_waiting_reader():
    a, b = trio.socket.socketpair()
    async with trio.open_nursery() as nursery:
        errors: list[BaseException] = []

        async def reader() -> None:
            try:
                await sockio.receive(a, 10, wait_first=True)
            except trio.ClosedResourceError as exc:
                errors.append(exc)

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        a.close()
    assert len(errors) == 1
    b.close()


async def test_a_send_larger_than_the_socket_buffer_waits_for_the_reader():
    a, b = trio.socket.socketpair()
    payload = b"y" * 4_000_000
    received = bytearray()
    async with trio.open_nursery() as nursery:

        async def reader() -> None:
            while len(received) < len(payload):
                received.extend(await sockio.receive(b, 65_536, wait_first=False))

        nursery.start_soon(reader)
        await sockio.send_all(a, payload)
    assert bytes(received) == payload
    a.close()
    b.close()


async def test_cancellation_is_honoured_on_entry_even_when_data_is_ready(autojump_clock):
    a, b = trio.socket.socketpair()
    await sockio.send_all(a, b"ready")
    with trio.CancelScope() as scope:
        scope.cancel()
        await sockio.receive(b, 10, wait_first=False)
    assert scope.cancelled_caught
    assert await sockio.receive(b, 10, wait_first=False) == b"ready"  # not consumed by the cancelled call
    with trio.move_on_after(1) as waiting:
        await sockio.receive(b, 10, wait_first=True)  # nothing there: a cancellable wait
    assert waiting.cancelled_caught
    a.close()
    b.close()


async def test_a_streak_of_instant_operations_yields_to_other_tasks():
    a, b = trio.socket.socketpair()
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)  # runs only when this task yields
        for _ in range(sockio.FAIR_STREAK * 4):  # every one completes at once
            await sockio.send_all(a, b"x")
        assert ran > 0  # the sender let the other task run meanwhile
        nursery.cancel_scope.cancel()
    a.close()
    b.close()
