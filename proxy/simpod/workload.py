"""What an OpenAI-style request asks of the engine, and what it truly costs.

Theory of operation: `parse_job(endpoint, body, profile, seed)` turns a request
body (bytes or an already-parsed dict) into a `Job`: prompt tokens, the output
length the sequence will TRULY produce, the KV tokens admission reserves, and the
flags the HTTP layer needs. It raises `BadRequest` (message for a 400) on invalid
JSON or missing/ill-typed fields.

Determinism: any randomness (the stop distribution) comes from a `random.Random`
seeded by blake2b(canonical JSON of the body, seed), so the same body under the
same seed always produces the same output length, across processes and replays
(Python's own `hash()` is salted per process, hence blake2b). The canonical form
is msgspec's sorted-key JSON of the parsed body, so a benchmark that holds the
body as a dict and the pod that received it as bytes agree.

`oracle(endpoint, body, profile, seed)` is the pure function benchmarks use for
oracle scheduling: the true output tokens and the uncontended service time (the
request alone on the engine, no faults, no cold penalty). Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

import msgspec

from proxy.simpod.profiles import Profile

CHAT = "chat"
COMPLETION = "completion"
EMBEDDING = "embedding"
# Inference paths below the profile's api_prefix ("/v1" unless the profile drops it).
ENDPOINT_SUFFIXES = {
    b"/chat/completions": CHAT,
    b"/completions": COMPLETION,
    b"/embeddings": EMBEDDING,
}
ENDPOINTS = {b"/v1" + path: kind for path, kind in ENDPOINT_SUFFIXES.items()}


def endpoints(api_prefix: str) -> dict[bytes, str]:
    """Inference path -> kind under a profile's api_prefix."""
    prefix = api_prefix.encode()
    return {prefix + path: kind for path, kind in ENDPOINT_SUFFIXES.items()}


_decode = msgspec.json.Decoder().decode
_canonical = msgspec.json.Encoder(order="sorted").encode


class BadRequest(ValueError):
    """The body is not a valid request for the endpoint; the message says why."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Job:
    kind: str  # CHAT, COMPLETION or EMBEDDING
    model: str
    prompt_tokens: int
    output_tokens: int  # what the sequence will truly generate (0 for embeddings)
    max_tokens: int  # the cap the request asked for (or the profile default)
    steps: int  # engine steps the sequence runs once admitted
    kv_tokens: int  # KV reserved at admission: prompt + max output tokens
    stream: bool
    include_usage: bool
    inputs: tuple[str, ...]  # embeddings inputs (for the deterministic vectors)
    encoding_format: str = "float"  # embeddings: "float" or "base64"


@dataclass(frozen=True, slots=True)
class Oracle:
    prompt_tokens: int
    output_tokens: int
    steps: int
    service_s: float  # uncontended: alone on the engine, no slowdown, warm


def _tokens(chars: int, profile: Profile) -> int:
    return max(1, math.ceil(chars / profile.chars_per_token))


def _text_chars(value: object, param: str) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):  # content parts, or a list of prompts
        total = 0
        for part in value:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
            elif isinstance(part, int):  # a token id
                total += 1
            else:
                raise BadRequest(f"'{param}' has an unsupported element", param)
        return total
    if value is None:
        return 0
    raise BadRequest(f"'{param}' must be a string or a list", param)


def _prompt_tokens(kind: str, body: dict, profile: Profile) -> tuple[int, tuple[str, ...]]:
    if kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' is required and must be a non-empty list", "messages")
        chars = 0
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise BadRequest("each message must be an object with a 'role'", "messages")
            chars += _text_chars(m.get("content"), "messages.content")
        return _tokens(chars, profile), ()
    if kind == COMPLETION:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required", "prompt")
        return _tokens(_text_chars(body["prompt"], "prompt"), profile), ()
    value = body.get("input")
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        value = [value]  # one text, or one pre-tokenised input
    if not isinstance(value, list) or not value:
        raise BadRequest("'input' is required: a string or a non-empty list", "input")
    per_item = []
    for item in value:
        if isinstance(item, str):
            per_item.append(_tokens(len(item), profile))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            per_item.append(len(item))  # token ids
        else:
            raise BadRequest("each 'input' must be a string or a list of token ids", "input")
    texts = tuple(i if isinstance(i, str) else msgspec.json.encode(i).decode() for i in value)
    if max(per_item) > profile.max_model_len:
        raise BadRequest(f"an input is longer than the maximum context length {profile.max_model_len}", "input")
    return sum(per_item), texts


def _max_tokens(body: dict, profile: Profile) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return profile.default_max_tokens
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest("'max_tokens' must be a positive integer", "max_tokens")
    return value


def _true_output(body: dict, cap: int, profile: Profile, seed: int) -> int:
    if profile.stop_mean_tokens <= 0:
        return cap
    digest = hashlib.blake2b(_canonical(body), digest_size=8, key=seed.to_bytes(8, "little", signed=True)).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    # Geometric with mean stop_mean_tokens (support 1, 2, ...): a stop token each step w.p. 1/mean.
    p = min(1.0, 1.0 / profile.stop_mean_tokens)
    length = 1 if p >= 1.0 else 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
    return min(cap, length)


def parse_job(kind: str, body: bytes | dict, profile: Profile, seed: int = 0) -> Job:
    """The engine work for one request, or BadRequest."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            body = _decode(body)
        except msgspec.DecodeError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model", profile.model)
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("'stream' must be a boolean", "stream")
    prompt, inputs = _prompt_tokens(kind, body, profile)
    if kind == EMBEDDING:
        steps = profile.fixed_steps or 1
        if prompt > profile.kv_capacity_tokens:
            raise BadRequest(f"the inputs need {prompt} KV tokens, more than the cache holds", "input")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise BadRequest("'encoding_format' must be 'float' or 'base64'", "encoding_format")
        return Job(kind, model, prompt, 0, 0, steps, prompt, False, False, inputs, fmt)
    cap = _max_tokens(body, profile)
    if prompt + cap > profile.max_model_len:
        raise BadRequest(
            f"prompt ({prompt} tokens) + max_tokens ({cap}) exceeds the maximum context length {profile.max_model_len}",
            "max_tokens",
        )
    output = profile.fixed_steps or _true_output(body, cap, profile, seed)
    kv = prompt + max(cap, output)
    if kv > profile.kv_capacity_tokens:
        raise BadRequest(f"the request needs {kv} KV tokens, more than the cache holds", "max_tokens")
    options = body.get("stream_options")
    include_usage = bool(stream) and isinstance(options, dict) and bool(options.get("include_usage"))
    return Job(kind, model, prompt, output, cap, output, kv, bool(stream), include_usage, ())


def uncontended_s(prompt_tokens: int, steps: int, profile: Profile) -> float:
    """Time the job takes alone on a warm, healthy engine (one sequence running)."""
    step_ms = profile.base_ms + profile.per_seq_ms
    total_ms = step_ms * steps + profile.prefill_ms_per_token * prompt_tokens
    return total_ms * profile.ms_to_s


def oracle(kind: str, body: bytes | dict, profile: Profile, seed: int = 0) -> Oracle:
    """True output tokens and uncontended service time of a request, for oracle schedulers.

    `kind` is CHAT, COMPLETION, EMBEDDING or the endpoint's path, with or without /v1
    ("/v1/chat/completions", "/embeddings").
    """
    if kind.startswith("/"):
        path = kind.encode()
        kind = ENDPOINTS.get(path) or ENDPOINT_SUFFIXES.get(path, kind)
    job = parse_job(kind, body, profile, seed)
    return Oracle(job.prompt_tokens, job.output_tokens, job.steps, uncontended_s(job.prompt_tokens, job.steps, profile))
