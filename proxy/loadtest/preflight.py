"""Before the run: one request per endpoint, so a wrong URL fails in a second, clearly.

Theory of operation: `preflight(target, mix)` sends one request for each
distinct (path, streaming) of the mix (at most MAX_PROBES) through the same
transport the run uses and turns what is wrong into a `TargetError` whose
message says what to fix: unreachable, not speaking the protocol, no answer,
4xx (a wrong path or body), a 2xx body that is not JSON, a stream without SSE
events. 5xx and 429 only warn: the pod may be warming up or busy, and the run
will count them. Returns the warnings.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from proxy.errors import RampmeterError, UpstreamConnectError
from proxy.http.messages import header_value
from proxy.loadtest.shapes import Mix
from proxy.loadtest.transport import Target, open_transport

MAX_PROBES = 4
PROBE_TIMEOUT_S = 30.0


class TargetError(RuntimeError):
    """The target cannot be load-tested as configured; the message says why and what to try."""


def _snippet(body: bytes) -> str:
    text = body[:160].decode("utf-8", "replace").replace("\n", " ")
    return text + ("..." if len(body) > 160 else "")


async def _probe(session, target: Target, shape_index: int, mix: Mix) -> tuple[int, bytes, bytes]:
    shape = mix.shapes[shape_index]
    where = f"{target.url} ({target.protocol})"
    try:
        resp = await session.send(shape_index, None)
    except UpstreamConnectError as exc:
        raise TargetError(f"cannot reach {where}: {exc}") from None
    except RampmeterError as exc:
        other = "http1" if target.protocol == "h2c" else "h2c"
        raise TargetError(
            f"{where} broke the exchange ({exc}); does it speak {target.protocol}? try --protocol {other}"
        ) from None
    try:
        parts: list[bytes] = []
        while chunk := await resp.receive():
            if sum(map(len, parts)) < (1 << 20):
                parts.append(chunk)
    except RampmeterError as exc:
        raise TargetError(f"{where} broke the response to {shape.path}: {exc}") from None
    finally:
        await resp.aclose()
    ctype = header_value(resp.headers, b"content-type") or b"none"
    return resp.status, b"".join(parts), ctype


async def preflight(target: Target, mix: Mix) -> list[str]:
    seen: set[object] = set()
    probes: list[Any] = []
    for i, s in enumerate(mix.shapes):
        if (s.path, s.stream) not in seen and len(probes) < MAX_PROBES:
            seen.add((s.path, s.stream))
            probes.append(i)
    warnings: list[str] = []
    problem: TargetError | None = None
    async with trio.open_nursery() as nursery:  # h2c connection tasks
        transport = open_transport(target, mix.shapes, nursery)
        session = transport.session()
        try:
            for i in probes:
                warnings += await _check(session, target, i, mix)
        except TargetError as exc:
            problem = exc  # raised outside the nursery, so callers see it bare, not in an ExceptionGroup
        finally:
            session.close()
            transport.close()
            nursery.cancel_scope.cancel()
    if problem is not None:
        raise problem
    return warnings


async def _check(session, target: Target, i: int, mix: Mix) -> list[str]:
    shape = mix.shapes[i]
    limit_s = min(PROBE_TIMEOUT_S, target.timeout_s)
    with trio.move_on_after(limit_s):
        status, body, ctype = await _probe(session, target, i, mix)
        return _judge(target, shape.path, shape.stream, status, body, ctype)
    raise TargetError(f"{target.url} did not answer {shape.path} within {limit_s:g} s")


def _judge(target: Target, path: str, stream: bool, status: int, body: bytes, ctype: bytes) -> list[str]:
    what = f"{target.url}{path}"
    if status == 429 or status >= 500:
        return [f"{what} answered {status} to the probe ({_snippet(body)}); running anyway, it will be counted"]
    if status >= 300:
        raise TargetError(f"{what} answered {status}: {_snippet(body)} (check the URL, the path and --model)")
    if stream:
        if b"data:" not in body:
            raise TargetError(
                f"{what} answered a streaming request with no SSE 'data:' events "
                f"(content-type {ctype.decode('latin-1')}): {_snippet(body)}"
            )
        return []
    if target.check_json:
        try:
            msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise TargetError(
                f"{what} answered {status} with a body that is not JSON (content-type "
                f"{ctype.decode('latin-1')}): {_snippet(body)}; is it an OpenAI-compatible endpoint? "
                "(--no-json-check accepts any body)"
            ) from None
    return []
