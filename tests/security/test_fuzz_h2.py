"""A bounded fuzzer for HTTP/2 frame sequences against a real sidecar and sim pod (see fuzz_helpers.py).

Each example is one h2c connection: the preface (rarely mangled), then up to 12
frames drawn from what a client may send and what it must not: HEADERS with
valid, missing, duplicated, empty or forbidden (pseudo-)headers, split into
CONTINUATION or not, with and without END_STREAM, padding and priority; DATA of
any size on open, closed, idle or stream 0; SETTINGS with legal and illegal
values; WINDOW_UPDATE from 0 to 2^31-1; RST_STREAM, PING, PRIORITY (self
dependency included) and GOAWAY; and frames of any type with random flags and
payload. What must hold: no :status 500; every stream we finished is answered (a
response head or RST_STREAM), or the connection is refused as a whole (GOAWAY or
close), in bounded time; after our EOF the sidecar closes; and at the end no
traceback in its log.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.testing.attacks import PREFACE, FrameReader
from proxy.testing.stack import sidecar, sim_pod
from tests.security.fuzz_helpers import ANSWER_S, BUG_STATUSES, CLOSE_S, FUZZ_SETTINGS
from tests.security.harness import assert_clean_log
from tests.security.reload_helpers import BASE

pytestmark = pytest.mark.integration

SEEN: Counter = Counter()
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()

stream_ids = st.one_of(st.sampled_from(["next", "next", "next", "last"]), st.sampled_from([0, 2, 4, 2**31 - 1]))
paths = st.sampled_from(
    [b"/v1/chat/completions", b"/v1/models", b"/v1/completions", b"/", b"", b"*", b"v1/x", b"http://x/v1/models"]
)
pseudo = st.fixed_dictionaries(
    {},
    optional={b":method": st.sampled_from([b"POST", b"GET", b"HEAD", b"CONNECT", b"", b"post"]),
              b":scheme": st.sampled_from([b"http", b"https", b""]), b":authority": st.sampled_from([b"x", b"", b"a:1"]),
              b":path": paths, b":status": st.just(b"200"), b":protocol": st.just(b"websocket")},
)  # fmt: skip
regular = st.lists(
    st.tuples(
        st.sampled_from([b"content-type", b"content-length", b"x-priority", b"x-request-timeout-ms", b"idempotency-key",
                         b"x-cost-hint", b"authorization", b"te", b"connection", b"Upper", b"host", b"x-pad", b"cookie"]),
        st.one_of(st.sampled_from([b"application/json", b"trailers", b"gzip", b"keep-alive", b"realtime", b"0", b"-1",
                                   b"99999999999", b"abc"]), st.binary(max_size=40)),
    ),
    max_size=5,
)  # fmt: skip


@st.composite
def headers_action(draw) -> tuple:
    fields = draw(pseudo)
    if draw(st.booleans()):  # mostly a well-formed request, so streams reach the handler
        fields = {b":method": b"POST", b":scheme": b"http", b":authority": b"x", b":path": draw(paths), **fields}
    block = [*fields.items(), *draw(regular)]
    if draw(st.booleans()):
        block = [(b":method", b"POST"), *block]  # a duplicate or a pseudo-header after... whatever came
    return ("headers", draw(stream_ids), block, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 3)))


# A whole, valid request: most examples carry some, so streams reach the handler and the pod among the junk.
request_action = st.tuples(st.just("request"), paths, st.sampled_from([CHAT, b"", b'{"model": "m", "prompt": "x"}']))
actions = st.one_of(
    request_action,
    request_action,
    request_action,
    headers_action(),
    st.tuples(st.just("data"), stream_ids, st.sampled_from([CHAT, b"", b"{", b"x" * 5000]), st.booleans(), st.integers(0, 20)),
    st.tuples(st.just("settings"), st.dictionaries(st.integers(0, 10), st.integers(0, 2**32 - 1), max_size=3), st.booleans()),
    st.tuples(st.just("window_update"), stream_ids, st.sampled_from([0, 1, 65_535, 2**31 - 1])),
    st.tuples(st.just("rst"), stream_ids, st.integers(0, 14)),
    st.tuples(st.just("ping"), st.booleans(), st.binary(min_size=0, max_size=12)),
    st.tuples(st.just("priority"), stream_ids, st.sampled_from(["self", 0, 3]), st.booleans()),
    st.tuples(st.just("goaway"), st.integers(0, 14)),
    st.tuples(st.just("raw"), st.integers(0, 255), st.integers(0, 255), stream_ids, st.binary(max_size=64)),
)  # fmt: skip


class Script:
    """Turns drawn actions into bytes, tracking stream ids and which streams a response is owed to."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.next_sid, self.last_sid = 1, 1
        self.owed: set[int] = set()  # streams we finished (END_STREAM) and did not reset

    def sid(self, choice) -> int:
        if choice == "next":
            self.last_sid, self.next_sid = self.next_sid, self.next_sid + 2
            return self.last_sid
        return self.last_sid if choice == "last" else choice

    def frame(self, action: tuple) -> bytes:
        """Frames as bytes, built by hand: hyperframe would refuse the invalid ones (DATA on stream 0, ...)."""
        kind = action[0]
        if kind == "request":
            _, path, body = action
            sid = self.sid("next")
            self.owed.add(sid)
            block = self.encoder.encode(
                [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"x"), (b":path", path),
                 (b"content-type", b"application/json")]
            )  # fmt: skip
            return frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, body)
        if kind == "headers":
            _, choice, block, end_stream, split, pad = action
            sid = self.sid(choice)
            data = self.encoder.encode(block)
            if end_stream:
                self.owed.add(sid)
            end = END_STREAM if end_stream else 0
            if split and len(data) > 1:
                half = len(data) // 2
                return frame(HEADERS, end | (PADDED if pad else 0), sid, padded(data[:half], pad)) + frame(
                    CONTINUATION, END_HEADERS, sid, data[half:]
                )
            return frame(HEADERS, end | END_HEADERS | (PADDED if pad else 0), sid, padded(data, pad))
        if kind == "data":
            _, choice, body, end_stream, pad = action
            sid = self.sid(choice)
            if end_stream:
                self.owed.add(sid)
            return frame(DATA, (END_STREAM if end_stream else 0) | (PADDED if pad else 0), sid, padded(body, pad))
        if kind == "settings":
            _, values, ack = action
            payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
            return frame(SETTINGS, ACK if ack else 0, 0, payload)
        if kind == "window_update":
            return frame(WINDOW_UPDATE, 0, self.sid(action[1]), action[2].to_bytes(4, "big"))
        if kind == "rst":
            sid = self.sid(action[1])
            self.owed.discard(sid)
            return frame(RST_STREAM, 0, sid, action[2].to_bytes(4, "big"))
        if kind == "ping":
            _, ack, payload = action
            return frame(PING, ACK if ack else 0, 0, payload)
        if kind == "priority":
            _, choice, on, exclusive = action
            sid = self.sid(choice)
            depends = (sid if on == "self" else on) | (0x80000000 if exclusive else 0)
            return frame(PRIORITY, 0, sid, depends.to_bytes(4, "big") + b"\x0f")
        if kind == "goaway":
            return frame(GOAWAY, 0, 0, (0).to_bytes(4, "big") + action[1].to_bytes(4, "big"))
        _, ftype, flags, choice, payload = action
        return frame(ftype, flags, self.sid(choice), payload)


DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8


def frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + (sid & 0x7FFFFFFF).to_bytes(4, "big") + payload


def padded(data: bytes, pad: int) -> bytes:
    return bytes([pad]) + data + b"\0" * pad if pad else data


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    policy = tmp_path_factory.mktemp("fuzz") / "policy.toml"
    policy.write_text(BASE + "[listen]\nheader_timeout_s = 2.0\nidle_timeout_s = 2.0\n")
    with sim_pod(speed=20.0) as pod, sidecar(pod.url(), policy=str(policy)) as proc:
        yield proc


def converse(address: tuple[str, int], data: bytes, owed: set[int]) -> FrameReader:
    """Send, wait for the owed answers (or a GOAWAY/close), half-close, wait for the close."""
    sock = socket.create_connection(address, timeout=ANSWER_S)
    frames, closed = FrameReader(), False

    def pump(until: float) -> bool:
        """Read until `until`; True once the sidecar closed."""
        while time.monotonic() < until:
            sock.settimeout(max(0.01, until - time.monotonic()))
            try:
                chunk = sock.recv(65_536)
            except TimeoutError:
                return False
            except OSError:
                return True
            if not chunk:
                return True
            frames.feed(chunk)
            if not (owed - frames.answered) and frames.goaway is None:
                return False
        return False

    try:
        try:
            sock.sendall(data)
        except OSError:
            return frames  # refused while we were sending: the connection is answered as a whole
        deadline = time.monotonic() + ANSWER_S
        while not closed and frames.goaway is None and owed - frames.answered and time.monotonic() < deadline:
            closed = pump(deadline)
        if not closed and frames.goaway is None:
            assert not owed - frames.answered, f"streams {sorted(owed - frames.answered)} unanswered after {ANSWER_S}s"
        if not closed:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                return frames
            end = time.monotonic() + CLOSE_S
            while not closed and time.monotonic() < end:
                closed = pump(end)
            assert closed, f"connection still open {CLOSE_S}s after our EOF"
        return frames
    finally:
        sock.close()


@FUZZ_SETTINGS
@given(script=st.lists(actions, min_size=1, max_size=12), preface_ok=st.integers(0, 30))
def test_fuzzed_frame_sequences_get_no_500_and_no_silence(stack, script, preface_ok):
    maker = Script()
    data = (PREFACE if preface_ok else PREFACE[:-2] + b"XX") + frame(SETTINGS, 0, 0, b"")
    data += b"".join(maker.frame(action) for action in script)
    host, _, port = stack.addresses["data"].rpartition(":")
    frames = converse((host, int(port)), data, maker.owed if preface_ok else set())
    SEEN.update(f"status:{s[:1]}xx" for s in frames.statuses.elements())
    SEEN.update(f"rst:{code}" for code in frames.resets.elements())
    if frames.goaway is not None:
        SEEN[f"goaway:{frames.goaway}"] += 1
    own = {sid: status for sid, (status, relayed) in frames.responses.items() if status in BUG_STATUSES and not relayed}
    assert not own, f"the sidecar answered {own} to {[a[0] for a in script]}: {data[24:400]!r}"
    relayed = {sid: status for sid, (status, relayed) in frames.responses.items() if status in BUG_STATUSES and relayed}
    assert not relayed, f"the sidecar relayed its pod's {relayed} to {[a[0] for a in script]}: {data[24:400]!r}"


def test_the_sidecar_log_is_clean_after_fuzzing(stack):
    print("fuzz h2 outcomes:", dict(SEEN))
    assert_clean_log(stack)
