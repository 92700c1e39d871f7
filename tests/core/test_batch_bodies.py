"""Merge and split of request bodies (proxy/core/batch_bodies.py): each part's answer is what it alone would get.

The fake servers below answer a body the way real ones do (shuffled embeddings with
float text the JSON encoder would not reproduce, sorted rerank results, a doubled
tensor); Hypothesis checks that splitting the answer to the merged call gives every
part exactly the bytes the server gives it alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.batch_bodies import (
    EmbeddingsCodec,
    KServeV2Codec,
    RerankCodec,
    SplitError,
    Unbatchable,
    apportion,
    text_tokens,
)


def _float_text(seed: str, i: int) -> str:
    """A float as some servers print it (trailing zeros, exponents): bytes a re-encoder would change."""
    h = hashlib.sha256(f"{seed}/{i}".encode()).digest()
    forms = ("%.7f", "%.3e", "%.10g")
    return forms[h[0] % 3] % ((h[1] - 128) / 97.0)


def embeddings_server(body: bytes, shuffle_seed: int = 0) -> bytes:
    req = json.loads(body)
    inputs = req["input"]
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    rows = []
    for i, item in enumerate(inputs):
        vec = ",".join(_float_text(json.dumps(item), d) for d in range(4))
        rows.append(f'{{"object":"embedding","embedding":[{vec}],"index":{i}}}')
    random.Random(shuffle_seed).shuffle(rows)  # the order of data is the server's business
    tokens = sum(text_tokens(len(x), 4.0) if isinstance(x, str) else len(x) for x in inputs)
    return (
        '{"object":"list","data":[' + ",".join(rows) + f'],"model":"{req.get("model", "m")}",'
        f'"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}'
    ).encode()


def canonical(body: bytes) -> dict:
    """An answer with its data in index order (the comparison must not depend on the server's shuffle)."""
    doc = json.loads(body)
    doc["data"] = sorted(doc["data"], key=lambda d: d["index"])
    return doc


texts = st.text(alphabet="abc xyz", min_size=0, max_size=40)
token_lists = st.lists(st.integers(0, 50_000), min_size=1, max_size=12)
inputs = st.one_of(
    texts,
    st.lists(texts, min_size=1, max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(inputs, min_size=1, max_size=8), st.integers(0, 1000))
def test_each_embeddings_part_gets_what_it_alone_gets(batch, seed):
    codec = EmbeddingsCodec(4.0)
    bodies = [json.dumps({"model": "m", "input": x}).encode() for x in batch]
    parts = [codec.parse(b) for b in bodies]
    merged = codec.merge(parts)
    answers = codec.split(embeddings_server(merged, seed), parts)
    for body, answer in zip(bodies, answers, strict=True):
        alone = embeddings_server(body)
        assert canonical(answer) == canonical(alone)
        assert raw_embeddings(answer) == raw_embeddings(alone)  # byte for byte


class _Item(msgspec.Struct):
    index: int
    embedding: msgspec.Raw


class _Answer(msgspec.Struct):
    data: list[_Item]


def raw_embeddings(body: bytes) -> list[bytes]:
    """The embedding values' bytes as the server wrote them, in index order."""
    return [bytes(d.embedding) for d in sorted(msgspec.json.decode(body, type=_Answer).data, key=lambda d: d.index)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(token_lists, min_size=1, max_size=3), min_size=1, max_size=5))
def test_token_id_inputs_batch_with_token_id_inputs(batch):
    codec = EmbeddingsCodec()
    bodies = [json.dumps({"model": "m", "input": x}).encode() for x in batch]
    parts = [codec.parse(b) for b in bodies]
    assert len({p.key for p in parts}) == 1
    answers = codec.split(embeddings_server(codec.merge(parts)), parts)
    for body, answer in zip(bodies, answers, strict=True):
        assert canonical(answer) == canonical(embeddings_server(body))


def test_parameters_models_and_input_kinds_separate_keys():
    codec = EmbeddingsCodec()
    key = lambda d: codec.parse(json.dumps(d).encode()).key  # noqa: E731
    base = {"model": "m", "input": "hi"}
    assert key(base) == key({"input": ["a", "b"], "model": "m"})  # field order and input size do not matter
    others = [
        {"model": "n", "input": "hi"},
        {**base, "dimensions": 256},
        {**base, "encoding_format": "base64"},
        {**base, "truncate": True},
        {"model": "m", "input": [1, 2, 3]},  # token ids never share with texts
    ]
    assert len({key(d) for d in others} | {key(base)}) == len(others) + 1


@pytest.mark.parametrize(
    "body,reason",
    [
        (b"not json", "not_json_object"),
        (b"[1,2]", "not_json_object"),
        (b'{"model":"m"}', "no_input"),
        (b'{"input":[]}', "input_shape"),
        (b'{"input":["a",[1,2]]}', "input_shape"),
        (b'{"input":[{"x":1}]}', "input_shape"),
    ],
)
def test_bodies_that_cannot_be_taken_apart_go_alone(body, reason):
    assert EmbeddingsCodec().parse(body) == Unbatchable(reason)


def test_an_answer_with_the_wrong_count_or_indices_cannot_be_split():
    codec = EmbeddingsCodec()
    parts = [codec.parse(b'{"input":["a","b"]}'), codec.parse(b'{"input":"c"}')]
    two = b'{"data":[{"index":0,"embedding":[1]},{"index":1,"embedding":[2]}]}'
    dup = b'{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]},{"index":1,"embedding":[3]}]}'
    for bad in (two, dup, b'{"object":"list"}', b"<html>"):
        with pytest.raises(SplitError):
            codec.split(bad, parts)


def test_an_error_naming_one_input_blames_its_part_renumbered():
    codec = EmbeddingsCodec()
    parts = [codec.parse(b'{"input":["a","b"]}'), codec.parse(b'{"input":["c","d","e"]}')]
    err = b'{"error":{"message":"input[3] is longer than 512 tokens","param":"input[3]"}}'
    assert codec.blame(err, parts) == (
        1,
        b'{"error":{"message":"input[1] is longer than 512 tokens","param":"input[1]"}}',
    )
    assert codec.blame(b'{"error":{"message":"input[0] and input[4] too long"}}', parts) is None
    assert codec.blame(b'{"error":{"message":"bad request"}}', parts) is None


@given(st.integers(0, 10_000), st.lists(st.integers(0, 500), min_size=1, max_size=20))
def test_apportioned_usage_adds_up_and_follows_the_weights(total, weights):
    shares = apportion(total, weights)
    assert sum(shares) == total and all(s >= 0 for s in shares)
    wsum = sum(weights)
    if wsum:
        assert all(abs(s - total * w / wsum) < 1 for s, w in zip(shares, weights, strict=True))


# --- rerank ------------------------------------------------------------------------------


def rerank_server(body: bytes) -> bytes:
    req = json.loads(body)
    docs = [d if isinstance(d, str) else d["text"] for d in req["documents"]]
    scored = []
    for i, d in enumerate(docs):
        score = int(hashlib.sha256((req["query"] + "|" + d).encode()).hexdigest()[:6], 16) / 2**24
        scored.append((score, i))
    scored.sort(key=lambda x: (-x[0], x[1]))
    if req.get("top_n") is not None:
        scored = scored[: req["top_n"]]
    results = ",".join(f'{{"index":{i},"relevance_score":{s:.6f}}}' for s, i in scored)
    tokens = sum(text_tokens(len(req["query"]) + len(d), 4.0) for d in docs)
    return f'{{"model":"r","results":[{results}],"usage":{{"total_tokens":{tokens}}}}}'.encode()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.text(alphabet="abcdef ", max_size=12), min_size=1, max_size=6), st.none() | st.integers(0, 4)
        ),
        min_size=1,
        max_size=6,
    )
)
def test_each_rerank_part_gets_its_own_results_top_n_included(batch):
    codec = RerankCodec()
    bodies = []
    for docs, top_n in batch:
        req = {"model": "r", "query": "what", "documents": docs}
        if top_n is not None:
            req["top_n"] = top_n
        bodies.append(json.dumps(req).encode())
    parts = [codec.parse(b) for b in bodies]
    assert len({p.key for p in parts}) == 1  # top_n is applied after the split, not a parameter of the call
    answers = codec.split(rerank_server(codec.merge(parts)), parts)
    for body, answer in zip(bodies, answers, strict=True):
        assert answer == rerank_server(body)


def test_rerank_queries_never_share_a_call():
    codec = RerankCodec()
    a = codec.parse(b'{"query":"a","documents":["x"]}')
    b = codec.parse(b'{"query":"b","documents":["x"]}')
    assert a.key != b.key


def test_a_bare_list_rerank_answer_splits_too():
    codec = RerankCodec()
    parts = [codec.parse(b'{"query":"q","documents":["a"]}'), codec.parse(b'{"query":"q","documents":["b","c"]}')]
    answer = b'[{"index":2,"score":0.9},{"index":0,"score":0.5},{"index":1,"score":0.1}]'
    assert codec.split(answer, parts) == [
        b'[{"index":0,"score":0.5}]',
        b'[{"index":1,"score":0.9},{"index":0,"score":0.1}]',
    ]


# --- KServe v2 ---------------------------------------------------------------------------


def kserve_server(body: bytes) -> bytes:
    req = json.loads(body)
    x = req["inputs"][0]
    out = {
        "model_name": "t",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": x["shape"], "data": [2 * v for v in x["data"]]}],
    }
    if "id" in req:
        out = {"id": req["id"], **out}
    return json.dumps(out, separators=(",", ":")).encode()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.none() | st.text(alphabet="abc", min_size=1, max_size=4)),
        min_size=1,
        max_size=6,
    )
)
def test_each_kserve_part_gets_its_own_rows_and_id(batch):
    codec = KServeV2Codec()
    bodies = []
    for k, (rows, rid) in enumerate(batch):
        req = {
            "inputs": [
                {"name": "x", "shape": [rows, 3], "datatype": "FP32", "data": [k * 100 + i for i in range(rows * 3)]}
            ]
        }
        if rid is not None:
            req = {"id": rid, **req}
        bodies.append(json.dumps(req, separators=(",", ":")).encode())
    parts = [codec.parse(b) for b in bodies]
    assert len({p.key for p in parts}) == 1
    answers = codec.split(kserve_server(codec.merge(parts)), parts)
    for body, answer in zip(bodies, answers, strict=True):
        assert json.loads(answer) == json.loads(kserve_server(body))


def test_kserve_inputs_that_do_not_fit_go_alone_and_layouts_do_not_mix():
    codec = KServeV2Codec()
    nested = b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[[1,2]]}]}'
    mismatch = b'{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3]}]}'
    ragged = b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]},{"name":"z","shape":[2],"datatype":"FP32","data":[1,2]}]}'
    for body in (nested, mismatch, ragged, b'{"inputs":[]}'):
        assert isinstance(codec.parse(body), Unbatchable)
    a = codec.parse(b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}')
    b = codec.parse(b'{"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}')
    c = codec.parse(b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"INT8","data":[1,2]}]}')
    assert len({a.key, b.key, c.key}) == 3


def test_a_kserve_output_without_the_batch_dimension_cannot_be_split():
    codec = KServeV2Codec()
    one = b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'
    parts = [codec.parse(one), codec.parse(one)]
    with pytest.raises(SplitError):
        codec.split(b'{"outputs":[{"name":"y","shape":[1],"datatype":"FP32","data":[3]}]}', parts)


def test_token_estimates_match_a_four_character_tokenizer():
    assert [text_tokens(n, 4.0) for n in (0, 1, 4, 5, 400)] == [1, 1, 1, 2, 100]
    assert math.ceil(7 / 4) == text_tokens(7, 4.0)
