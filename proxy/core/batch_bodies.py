"""Merging request bodies into one upstream call and splitting its answer, pure (msgspec).

Theory of operation: a `Codec` per body shape turns one request body into a
`Part` (`parse`), several parts into one upstream body (`merge`), the upstream's
answer into one body per part (`split`), and, when the upstream refuses the call
naming one input (`input[7]`), says whose it was (`blame`). Everything a caller
did not send in its batched field must be equal for parts to share a call: the
`Part.key` is the shape's name plus the canonical JSON (sorted keys) of every
other field, so different models, `dimensions`, `encoding_format`, truncation
flags, queries or requested outputs never mix. A body the codec cannot take
apart cleanly is `Unbatchable` (it is forwarded alone, unchanged).

Values are carried as `msgspec.Raw`: the bytes of each input go upstream as the
client wrote them, and the bytes of each answer value (an embedding's floats, a
base64 string, a score, a tensor element) come back byte for byte; only indices,
shapes and usage are rewritten. Usage counters are apportioned to parts by their
estimated tokens (largest remainder, so they add up to the upstream's figure).

Shapes:
- embeddings (OpenAI): `input` is a string, a list of strings, one token-id list,
  or a list of token-id lists (texts and token ids never share a call); the
  answer's `data[i].index` maps back to the part and is renumbered from 0.
- rerank (Cohere / Jina / vLLM `/v1/rerank`, TEI `/rerank`): `query` +
  `documents` (strings or `{text}`); one query per call is the shape, so only
  parts with the same query share a call; `top_n` is applied per part after the
  split (the merged call asks for every result); results keep the server's
  order, or by score when a part asked for top_n.
- kserve_v2 (KServe v2 / Open Inference Protocol infer, JSON): every input has
  the batch dimension first, the same batch size B, flat `data` of
  prod(shape) elements; inputs are concatenated along dimension 0 and every
  output must come back with the summed batch size first, then is sliced by
  rows. A part's `id` is echoed back to it. Nested data, binary tensors and
  outputs without the batch dimension are not batched.

Bounded: only bodies the request path already read under its size cap reach
here; the regex in `blame` sees at most 64 KiB.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import Raw

_obj = msgspec.json.Decoder(dict[str, Raw]).decode
_raw_list = msgspec.json.Decoder(list[Raw]).decode
_obj_list = msgspec.json.Decoder(list[dict[str, Raw]]).decode
_any = msgspec.json.Decoder().decode
_int = msgspec.json.Decoder(int).decode
_encode = msgspec.json.Encoder().encode
_canonical = msgspec.json.Encoder(order="sorted").encode
_BLAME_SCAN_BYTES = 65_536
_NAMED_INDEX = re.compile(rb"\b(input|inputs|documents|texts)\s*\[\s*(\d{1,9})\s*\]")


class SplitError(ValueError):
    """The upstream's answer cannot be split back per request (wrong count, shape, indices or JSON)."""


@dataclass(frozen=True, slots=True)
class Unbatchable:
    reason: str  # low cardinality: a metrics label


@dataclass(frozen=True, slots=True)
class Part:
    """One request's share of a call."""

    key: bytes  # equal keys may share a call
    items: tuple[Raw, ...]  # the batched values, as sent
    item_tokens: tuple[int, ...]  # estimated tokens (kserve_v2: tensor elements) per item
    fields: dict[str, Raw]  # every other top-level field, as sent
    extra: Any = field(default=None)  # per shape: rerank top_n; kserve_v2 input layout

    @property
    def count(self) -> int:
        return len(self.item_tokens)

    @property
    def tokens(self) -> int:
        return sum(self.item_tokens)

    @property
    def longest(self) -> int:
        return max(self.item_tokens)


def text_tokens(chars: int, chars_per_token: float) -> int:
    """Tokens of a text of `chars` characters: at least one."""
    return max(1, math.ceil(chars / chars_per_token))


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split the integer `total` by `weights` (largest remainder): shares add up to `total` exactly."""
    n = len(weights)
    wsum = sum(weights)
    if n == 0:
        return []
    if wsum <= 0:
        weights, wsum = [1] * n, n
    exact = [total * w / wsum for w in weights]
    shares = [math.floor(x) for x in exact]
    left = total - sum(shares)
    order = sorted(range(n), key=lambda i: (shares[i] - exact[i], i))  # largest remainder first
    for i in order[: max(0, left)]:
        shares[i] += 1
    return shares


def offsets(parts: Sequence[Part]) -> list[int]:
    out, at = [], 0
    for p in parts:
        out.append(at)
        at += p.count
    return out


def _key(kind: bytes, fields: dict[str, Raw], drop: tuple[str, ...] = ()) -> bytes:
    kept = {k: _any(v) for k, v in fields.items() if k not in drop}
    return kind + b"|" + _canonical(kept)


def _decoded_object(body: bytes) -> dict[str, Raw] | Unbatchable:
    try:
        return _obj(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Unbatchable("not_json_object")


def _usage(raw: Raw | None, parts: Sequence[Part]) -> list[Raw | None]:
    """Each part's share of a `usage` object: integer counters apportioned by tokens, the rest as is."""
    if raw is None:
        return [None] * len(parts)
    try:
        usage = _obj(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return [raw] * len(parts)
    weights = [p.tokens for p in parts]
    shares: dict[str, list[int]] = {}
    for name, value in usage.items():
        v = _any(value)
        if isinstance(v, int) and not isinstance(v, bool):
            shares[name] = apportion(v, weights)
    out: list[Raw | None] = []
    for j in range(len(parts)):
        out.append(Raw(_encode({k: Raw(b"%d" % shares[k][j]) if k in shares else v for k, v in usage.items()})))
    return out


def _blame(body: bytes, parts: Sequence[Part]) -> tuple[int, bytes] | None:
    """(part index, body renumbered for it) when the error names exactly one input, else None."""
    head = body[:_BLAME_SCAN_BYTES]
    named = {int(m.group(2)) for m in _NAMED_INDEX.finditer(head)}
    if len(named) != 1:
        return None
    (index,) = named
    starts = offsets(parts)
    for j, (start, p) in enumerate(zip(starts, parts, strict=True)):
        if start <= index < start + p.count:
            local = index - start

            def renumber(m: re.Match[bytes], _i: int = index, _l: int = local) -> bytes:
                renumbered: bytes = m.group(1) + b"[%d]" % _l if int(m.group(2)) == _i else m.group(0)
                return renumbered

            return j, _NAMED_INDEX.sub(renumber, body)
    return None


class EmbeddingsCodec:
    name = "embeddings"

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.cpt = chars_per_token

    def parse(self, body: bytes) -> Part | Unbatchable:
        obj = _decoded_object(body)
        if isinstance(obj, Unbatchable):
            return obj
        raw = obj.get("input")
        if raw is None:
            return Unbatchable("no_input")
        try:
            value = _any(raw)
        except msgspec.DecodeError:
            return Unbatchable("not_json_object")
        items: tuple[Raw, ...]
        tokens: tuple[int, ...]
        if isinstance(value, str):
            items, tokens, kind = (raw,), (text_tokens(len(value), self.cpt),), b"embeddings/text"
        elif _token_ids(value):
            items, tokens, kind = (raw,), (len(value),), b"embeddings/ids"
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            items, tokens, kind = (
                tuple(_raw_list(raw)),
                tuple(text_tokens(len(v), self.cpt) for v in value),
                b"embeddings/text",
            )
        elif isinstance(value, list) and value and all(_token_ids(v) for v in value):
            items, tokens, kind = tuple(_raw_list(raw)), tuple(len(v) for v in value), b"embeddings/ids"
        else:
            return Unbatchable("input_shape")
        fields = {k: v for k, v in obj.items() if k != "input"}
        return Part(_key(kind, fields), items, tokens, fields)

    def merge(self, parts: Sequence[Part]) -> bytes:
        return _encode({**parts[0].fields, "input": [raw for p in parts for raw in p.items]})

    def split(self, body: bytes, parts: Sequence[Part]) -> list[bytes]:
        try:
            obj = _obj(body)
            data = _obj_list(obj["data"])
            by_index = {_int(d["index"]): d for d in data}
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
            raise SplitError(f"embeddings answer without data[].index: {exc}") from None
        total = sum(p.count for p in parts)
        if len(data) != total or set(by_index) != set(range(total)):
            raise SplitError(f"{len(data)} embeddings answered for {total} inputs")
        usages = _usage(obj.get("usage"), parts)
        out = []
        for start, p, usage in zip(offsets(parts), parts, usages, strict=True):
            mine = [{**by_index[start + i], "index": Raw(b"%d" % i)} for i in range(p.count)]
            answer = {**obj, "data": mine}
            if usage is not None:
                answer["usage"] = usage
            out.append(_encode(answer))
        return out

    def blame(self, body: bytes, parts: Sequence[Part]) -> tuple[int, bytes] | None:
        return _blame(body, parts)


def _token_ids(value: object) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


class RerankCodec:
    name = "rerank"

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.cpt = chars_per_token

    def parse(self, body: bytes) -> Part | Unbatchable:
        obj = _decoded_object(body)
        if isinstance(obj, Unbatchable):
            return obj
        try:
            query = _any(obj["query"]) if "query" in obj else None
            docs_raw = _raw_list(obj["documents"]) if "documents" in obj else None
            docs = [_any(d) for d in docs_raw or ()]
            top_n = _any(obj["top_n"]) if "top_n" in obj else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            return Unbatchable("input_shape")
        if not isinstance(query, str) or not docs:
            return Unbatchable("no_input")
        texts = [d if isinstance(d, str) else d.get("text") if isinstance(d, dict) else None for d in docs]
        if not all(isinstance(t, str) for t in texts):
            return Unbatchable("input_shape")
        if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
            return Unbatchable("input_shape")
        fields = {k: v for k, v in obj.items() if k not in ("documents", "top_n")}
        tokens = tuple(text_tokens(len(query) + len(str(t)), self.cpt) for t in texts)  # all str (checked above)
        return Part(_key(b"rerank", fields), tuple(docs_raw or ()), tokens, fields, top_n)

    def merge(self, parts: Sequence[Part]) -> bytes:
        return _encode({**parts[0].fields, "documents": [raw for p in parts for raw in p.items]})

    def split(self, body: bytes, parts: Sequence[Part]) -> list[bytes]:
        bare = body.lstrip()[:1] == b"["
        try:
            obj: dict[str, Raw] = {} if bare else _obj(body)
            results = _obj_list(body if bare else obj["results"])
            indices = [_int(r["index"]) for r in results]
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError) as exc:
            raise SplitError(f"rerank answer without results[].index: {exc}") from None
        total = sum(p.count for p in parts)
        if len(results) != total or set(indices) != set(range(total)):
            raise SplitError(f"{len(results)} rerank results answered for {total} documents")
        usages: list[Raw | None] = [None] * len(parts) if bare else _usage(obj.get("usage"), parts)
        out = []
        for start, p, usage in zip(offsets(parts), parts, usages, strict=True):
            mine = [
                {**r, "index": Raw(b"%d" % (i - start))}
                for r, i in zip(results, indices, strict=True)
                if start <= i < start + p.count
            ]
            if p.extra is not None:  # top_n: the best p.extra by score, as the server would have cut them
                mine = sorted(mine, key=_score, reverse=True)[: p.extra]
            if bare:
                out.append(_encode(mine))
                continue
            answer: dict[str, Any] = {**obj, "results": mine}
            if usage is not None:
                answer["usage"] = usage
            out.append(_encode(answer))
        return out

    def blame(self, body: bytes, parts: Sequence[Part]) -> tuple[int, bytes] | None:
        return _blame(body, parts)


def _score(result: dict[str, Raw]) -> float:
    raw = result.get("relevance_score", result.get("score"))
    try:
        value = _any(raw) if raw is not None else None
    except msgspec.DecodeError:
        return -math.inf
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else -math.inf


@dataclass(frozen=True, slots=True)
class _Tensor:
    """One kserve_v2 input of a part: everything but shape and data, the shape after dimension 0, the rows."""

    fields: dict[str, Raw]
    tail: tuple[int, ...]
    data: tuple[Raw, ...]


class KServeV2Codec:
    name = "kserve_v2"

    def parse(self, body: bytes) -> Part | Unbatchable:
        obj = _decoded_object(body)
        if isinstance(obj, Unbatchable):
            return obj
        try:
            inputs = _obj_list(obj["inputs"])
            tensors = [self._tensor(t) for t in inputs]
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError, ValueError):
            return Unbatchable("input_shape")
        if not tensors or len({rows for rows, _ in tensors}) != 1:
            return Unbatchable("input_shape")
        rows = tensors[0][0]
        layout = tuple(t for _, t in tensors)
        per_row = sum(math.prod(t.tail) for t in layout)
        fields = {k: v for k, v in obj.items() if k not in ("inputs", "id")}
        described = {k: _any(v) for k, v in fields.items()} | {
            "inputs": [{"tail": t.tail, **{k: _any(v) for k, v in t.fields.items()}} for t in layout]
        }
        key = b"kserve_v2|" + _canonical(described)
        return Part(key, (), (per_row,) * rows, fields, (obj.get("id"), layout))

    @staticmethod
    def _tensor(t: dict[str, Raw]) -> tuple[int, _Tensor]:
        shape = msgspec.json.decode(t["shape"], type=list[int])
        data = _raw_list(t["data"])
        if not shape or shape[0] < 1 or any(d < 0 for d in shape) or len(data) != math.prod(shape):
            raise ValueError("data is not flat, or does not match the shape")
        if any(bytes(d)[:1] == b"[" for d in data):
            raise ValueError("nested data")
        rest = {k: v for k, v in t.items() if k not in ("shape", "data")}
        return shape[0], _Tensor(rest, tuple(shape[1:]), tuple(data))

    def merge(self, parts: Sequence[Part]) -> bytes:
        rows = sum(p.count for p in parts)
        first = parts[0].extra[1]
        inputs = []
        for k, t in enumerate(first):
            data = [d for p in parts for d in p.extra[1][k].data]
            inputs.append({**t.fields, "shape": [rows, *t.tail], "data": data})
        return _encode({**parts[0].fields, "inputs": inputs})

    def split(self, body: bytes, parts: Sequence[Part]) -> list[bytes]:
        rows = sum(p.count for p in parts)
        try:
            obj = _obj(body)
            outputs = []
            for out in _obj_list(obj["outputs"]):
                shape = msgspec.json.decode(out["shape"], type=list[int])
                data = _raw_list(out["data"])
                if not shape or shape[0] != rows or len(data) != math.prod(shape):
                    raise SplitError(f"output shape {shape} has no leading batch dimension of {rows}")
                outputs.append((out, shape[1:], data))
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
            raise SplitError(f"kserve_v2 answer without outputs[].shape/data: {exc}") from None
        answers = []
        for start, p in zip(offsets(parts), parts, strict=True):
            mine = []
            for out, tail, data in outputs:
                width = math.prod(tail)
                rows_data = data[start * width : (start + p.count) * width]
                mine.append({**out, "shape": Raw(_encode([p.count, *tail])), "data": Raw(_encode(rows_data))})
            answer: dict[str, Any] = {k: v for k, v in obj.items() if k != "id"}
            own_id = p.extra[0]
            if own_id is not None:
                answer = {"id": own_id, **answer}
            answer["outputs"] = mine
            answers.append(_encode(answer))
        return answers

    def blame(self, body: bytes, parts: Sequence[Part]) -> tuple[int, bytes] | None:
        return None  # a v2 error names a tensor, never a row


def codec_for(kind: str, chars_per_token: float = 4.0) -> EmbeddingsCodec | RerankCodec | KServeV2Codec:
    if kind == "embeddings":
        return EmbeddingsCodec(chars_per_token)
    if kind == "rerank":
        return RerankCodec(chars_per_token)
    if kind == "kserve_v2":
        return KServeV2Codec()
    raise ValueError(f"no codec for {kind!r}")
