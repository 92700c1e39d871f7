"""upstream_h1.framed: the framing fields of the request sent upstream match its body, whatever the caller gave."""

from proxy.http.upstream_h1 import framed

HOST = (b"host", b"u")


async def _stream():
    yield b"x"


def test_a_bodiless_get_keeps_its_fields_as_they_are():
    headers = [HOST, (b"accept", b"*/*")]
    assert framed(b"GET", headers, b"") is headers


def test_a_bytes_body_gets_its_exact_length_and_loses_the_callers_framing():
    headers = [HOST, (b"content-length", b"99"), (b"transfer-encoding", b"chunked")]
    assert framed(b"POST", headers, b"abc") == [HOST, (b"content-length", b"3")]


def test_an_empty_post_says_content_length_zero():
    assert framed(b"POST", [HOST], b"") == [HOST, (b"content-length", b"0")]


def test_a_get_with_a_stray_content_length_is_reframed():
    assert framed(b"GET", [HOST, (b"content-length", b"5")], b"") == [HOST, (b"content-length", b"0")]


def test_a_streamed_body_keeps_a_given_length_and_otherwise_goes_chunked():
    sized = [HOST, (b"content-length", b"1")]
    assert framed(b"POST", sized, _stream()) is sized
    assert framed(b"POST", [HOST], _stream()) == [HOST, (b"transfer-encoding", b"chunked")]
    both = [HOST, (b"content-length", b"1"), (b"transfer-encoding", b"chunked")]
    assert framed(b"POST", both, _stream()) == [HOST, (b"transfer-encoding", b"chunked")]
