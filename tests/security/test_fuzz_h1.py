"""A bounded fuzzer for HTTP/1.1 requests against a real sidecar and sim pod (see fuzz_helpers.py).

Each example is one connection: a request line (methods, origin-, absolute- and
asterisk-form targets, garbage), headers from the wire contract and HTTP framing
(Content-Length, Transfer-Encoding, Expect, Connection, duplicates, bad values,
bytes that are not tokens), a body (valid chat/completion JSON, arbitrary JSON,
JSON nested up to 3,000 deep, raw bytes) framed correctly, chunked, with both
Content-Length and Transfer-Encoding, short or long, and sometimes a second request
pipelined behind it. What must hold: no 500, an answer or a close in bounded time
(never silence), and at the end no traceback in the sidecar's log.
"""

from __future__ import annotations

import json
import socket
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.testing.attacks import H1Reader
from proxy.testing.stack import sidecar, sim_pod
from tests.security.fuzz_helpers import ANSWER_S, BUG_STATUSES, CLOSE_S, FUZZ_SETTINGS
from tests.security.harness import assert_clean_log
from tests.security.reload_helpers import BASE

pytestmark = pytest.mark.integration

SEEN: Counter = Counter()

PATHS = [b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/models", b"/", b"/metrics", b"/x"]
methods = st.sampled_from(
    [b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT", b"get", b"G(T"]
)
paths = st.sampled_from(PATHS)
targets = st.one_of(
    paths,
    paths.map(lambda p: b"http://x" + p),  # absolute-form (RFC 9112 3.2.2: a server must accept it)
    paths.map(lambda p: b"http://x:1" + p + b"?q=1"),
    st.sampled_from([b"*", b"v1/models", b"//v1/models", b"/%", b"/%zz", b"/v1/../metrics", b"x:y", b"/\x7f"]),
    st.tuples(paths, st.binary(max_size=40)).map(lambda t: t[0] + b"?" + t[1].replace(b" ", b"+").replace(b"\r", b"").replace(b"\n", b"")),
)  # fmt: skip
versions = st.sampled_from([b"HTTP/1.1"] * 6 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2", b"HTTP/1", b"http/1.1"])
header_values = st.one_of(
    st.integers(-5, 10**12).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b" ", b"chunked", b"gzip, chunked", b"close", b"keep-alive", b"100-continue", b"realtime", b"batch", b"nope"]),
    st.binary(max_size=64).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
)  # fmt: skip
header_names = st.sampled_from(
    [b"x-priority", b"x-request-timeout-ms", b"grpc-timeout", b"idempotency-key", b"x-cost-hint", b"x-tenant",
     b"authorization", b"content-type", b"expect", b"connection", b"te", b"upgrade", b"x-forwarded-for", b"host",
     b"x-custom", b"bad header", b"x\x00y", b":path", b""]
)  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)
chat = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.just([{"role": "user", "content": "hi"}])},
    optional={"max_tokens": st.integers(-1, 8), "stream": st.booleans(), "n": st.integers(0, 2), "prompt": json_values,
              "input": json_values, "max_completion_tokens": json_values},
)  # fmt: skip
deep = st.tuples(st.integers(1, 3000), st.sampled_from(["prompt", "messages", "input", "max_tokens"])).map(
    lambda t: b'{"model": "m", "%s": ' % t[1].encode() + b"[" * t[0] + b"]" * t[0] + b"}"
)
bodies = st.one_of(
    chat.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    deep,
    st.binary(max_size=300),
    st.just(b""),
)
framings = st.sampled_from(["length", "length", "chunked", "none", "both", "long", "short", "bad_chunked", "twice"])


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for size in sizes:
        piece = body[i : i + size]
        if not piece:
            break
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
        i += size
    if i < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - i, body[i:])
    return out + b"0\r\n\r\n"


@st.composite
def requests(draw) -> tuple[bytes, bool, bool]:
    """(bytes to send, complete by construction, HEAD): complete ones must be answered."""
    method, target, version = draw(methods), draw(targets), draw(versions)
    headers = [(b"host", b"x")] if draw(st.booleans()) or version != b"HTTP/1.1" else []
    headers += draw(st.lists(st.tuples(header_names, header_values), max_size=6))
    body, framing = draw(bodies), draw(framings)
    complete = True
    if framing == "length":
        headers.append((b"content-length", b"%d" % len(body)))
    elif framing == "chunked":
        headers.append((b"transfer-encoding", b"chunked"))
        body = chunked(body, draw(st.lists(st.integers(1, 64), max_size=5)))
    elif framing == "both":
        headers += [(b"content-length", b"%d" % len(body)), (b"transfer-encoding", b"chunked")]
        body = chunked(body, [len(body) or 1])
    elif framing == "long":  # announces more than it sends: the sidecar must not wait for ever
        headers.append((b"content-length", b"%d" % (len(body) + draw(st.integers(1, 10_000)))))
        complete = False
    elif framing == "short":
        headers.append((b"content-length", b"%d" % (len(body) // 2)))
    elif framing == "bad_chunked":
        headers.append((b"transfer-encoding", b"chunked"))
        body = draw(
            st.sampled_from(
                [b"zz\r\n", b"-1\r\nx\r\n0\r\n\r\n", b"ffffffffffffffff\r\nx", b"5;x=y\r\nhello\r\n0\r\nt: v\r\n\r\n"]
            )
        )
        complete = False
    elif framing == "twice":
        headers += [(b"content-length", b"%d" % len(body)), (b"content-length", b"%d" % (len(body) + 1))]
    else:
        body = b""
    head = method + b" " + target + b" " + version + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    data = head + b"\r\n" + body
    if complete and draw(st.booleans()):
        data += b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"  # pipelined behind it
    return data, complete, method == b"HEAD"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    policy = tmp_path_factory.mktemp("fuzz") / "policy.toml"
    policy.write_text(BASE + "[listen]\nheader_timeout_s = 2.0\nidle_timeout_s = 2.0\n")
    with sim_pod(speed=20.0) as pod, sidecar(pod.url(), policy=str(policy)) as proc:
        yield proc


def _outcome(response: tuple[int, dict] | None) -> str:
    if response is None:
        return "closed"
    status, headers = response
    # A relayed answer carries our `via`: a 500 with it is the pod's (still a bug: the sim pod's input handling).
    return f"{'upstream' if b'via' in headers else 'status'}:{status}"


def exchange(address: tuple[str, int], data: bytes, complete: bool, head: bool) -> list[str]:
    """Send, read what comes back; the outcomes ('status:N', 'closed'), or AssertionError on silence."""
    sock = socket.create_connection(address, timeout=ANSWER_S)
    outcomes: list[str] = []
    try:
        try:
            sock.sendall(data)
        except OSError:
            return ["reset_while_sending"]  # the sidecar closed on us mid-request: an answer too
        reader = H1Reader(sock)
        if complete:
            try:
                first = reader.response(head_request=head)
            except TimeoutError:
                raise AssertionError(f"no answer in {ANSWER_S}s and the connection is still open") from None
            outcomes.append(_outcome(first))
            if first is None:
                return outcomes
        try:
            sock.shutdown(socket.SHUT_WR)  # we are done: the sidecar must answer or close now
        except OSError:
            return [*outcomes, "closed"]
        sock.settimeout(CLOSE_S)
        while True:
            try:
                more = reader.response(head_request=head)
            except TimeoutError:
                raise AssertionError(f"connection neither answered nor closed {CLOSE_S}s after our EOF") from None
            if more is None:
                return [*outcomes, "closed"]
            outcomes.append(_outcome(more))
    finally:
        sock.close()


@FUZZ_SETTINGS
@given(request=requests())
def test_fuzzed_requests_get_no_500_and_no_silence(stack, request):
    data, complete, head = request
    host, _, port = stack.addresses["data"].rpartition(":")
    outcomes = exchange((host, int(port)), data, complete, head)
    SEEN.update(o if ":" not in o else o[:-2] + "xx" for o in outcomes)
    assert not [o for o in outcomes if o.startswith("status:") and int(o[7:]) in BUG_STATUSES], (
        f"the sidecar answered {outcomes} to {data[:300]!r}"
    )
    assert not [o for o in outcomes if o.startswith("upstream:") and int(o[9:]) in BUG_STATUSES], (
        f"the sidecar relayed its pod's {outcomes} to {data[:300]!r}"
    )


def test_the_sidecar_log_is_clean_after_fuzzing(stack):
    print("fuzz h1 outcomes:", dict(SEEN))
    assert_clean_log(stack)
