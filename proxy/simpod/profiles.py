"""Hardware/model profiles of the simulated pod: what one engine step costs.

Theory of operation: a `Profile` is a frozen value holding every number the
engine's cost model needs (see `engine.py`):

    step_s = (base_ms + per_seq_ms * running + prefill_ms_per_token * admitted_prompt_tokens)
             * slowdown * cold_multiplier / speed / 1000

Every running sequence advances one step per engine step; a generating sequence
emits one output token per step (its first one in the step that admits it, as
vLLM's prefill step does), an embeddings sequence is prefill only and finishes in
the step that admits it. `speed` divides every engine time, so tests and
benchmarks can run a realistic shape faster than real time; all times the engine
reports are then wall (trio) seconds.

The three built-in profiles (figures are chosen, not measured on a real GPU):
- "llm": a 7-8B model on one mid-size GPU under vLLM: 6 ms a decode step plus
  0.15 ms per running sequence, 0.02 ms per prompt token of prefill, up to 64
  sequences, 48k KV tokens, 8k context, 128 output tokens when max_tokens is absent.
  Alone, a 100-token prompt with 128 output tokens takes about 0.79 s; a full
  batch of 64 steps every 15.6 ms, about 4100 output tokens/s (~32 such req/s).
- "embeddings": a BERT-size encoder: prefill only, 4 ms a step, 256 sequences.
- "fixed": every request, whatever its body, runs exactly `fixed_steps` (N) steps
  of a constant `base_ms` (T) with at most `max_num_seqs` (C) at once, KV never
  binding. Its capacity is computable:
      capacity_rps = C / (N * T / 1000 / speed)        (default: 32 / (10 * 0.010) = 320 req/s)
  and a lone request takes N * T / speed ms. The load generator's accuracy
  benchmark relies on this formula.

Habits of real servers (issue 12: the pod was kinder than all of them), each a
field, so any profile can take any of them (`--stops-on-cancel false` ...):
- `stops_on_cancel`: False: a request whose client went away keeps its place in
  the queue or batch and runs to the end (llama.cpp non-streaming, LitServe,
  PyTriton, MLServer, most embeddings servers); its work counts as wasted.
- `health_path`: "" serves no health endpoint (404), as the serial llama.cpp-style
  server the issue measured; any other path moves it (/healthz, /ping ...).
- `api_prefix`: "" serves /chat/completions, /completions, /embeddings, /models
  without /v1 (as many embeddings servers do).
- `batching`: "continuous" (vLLM: join the running batch every step) or "padded"
  (a static batch: formed from the queue only when the engine is idle, every
  input padded to the longest prompt, and every member finishes with the
  longest one, as TorchServe, Triton's plain dynamic batcher and LitServe do).
- max_num_seqs = 1 is a strictly serial FIFO engine (llama.cpp with one slot).
- `frontend_ms`: a request spends this long in the server's HTTP front end before
  the engine counts it (parsing, tokenizing) and again after it ends (the answer
  being written), outside the engine's gauges: vLLM's CPU build on a busy machine
  held 3-4 requests there (bench/real_servers, 2026-12-01). `frontend_spread`
  makes each crossing vary (on a busy machine the front end holds more or fewer
  from moment to moment, which a limit read from the gauges must not mistake
  for the engine's queue).

Two more built-in profiles carry those habits:
- "serial": a llama.cpp-style server on CPU: one request at a time, first come
  first served, 20 ms a generated token, 0.5 ms a prompt token, keeps computing
  after a disconnect. Alone, 16 output tokens take ~0.34 s, 256 take ~5.1 s.
- "keeps-computing": a LitServe/PyTriton-style server: padded batches of up to
  8, 25 ms a step, keeps computing after a disconnect.

Two embeddings servers for micro-batching (issue 19; bench/microbatch):
- "embeddings-serial": a FastAPI / custom-predictor encoder that does not batch:
  one call at a time, first come first served, 20 ms a call (one forward pass)
  plus 0.02 ms a token of all its inputs, so one call with 32 inputs of 32
  tokens costs 40.5 ms where 32 separate calls cost 660 ms. Keeps computing
  after a disconnect, as such servers do.
- "embeddings-padded": an encoder server that batches internally (TorchServe /
  Triton's plain dynamic batcher): padded batches of up to 32 calls, 10 ms a
  batch plus 0.1 ms a call, every call padded to the batch's longest prompt
  (0.02 ms a token) and finishing with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def _f(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class Profile:
    name: str = _f("llm", "profile name")
    model: str = _f("sim-llm", "model id reported by /v1/models and responses")
    base_ms: float = _f(6.0, "fixed cost of one engine step, ms")
    per_seq_ms: float = _f(0.15, "added step cost per running sequence, ms")
    prefill_ms_per_token: float = _f(0.02, "added step cost per prompt token admitted in the step, ms")
    max_num_seqs: int = _f(64, "most sequences running in one batch")
    kv_capacity_tokens: int = _f(49_152, "KV cache size in tokens; admission reserves prompt + max output tokens")
    max_model_len: int = _f(8192, "longest prompt + max_tokens accepted (longer answers 400)")
    default_max_tokens: int = _f(128, "output tokens when a request sets no max_tokens")
    chars_per_token: float = _f(4.0, "prompt characters per token")
    stop_mean_tokens: float = _f(
        0.0, "if > 0, output lengths are geometric with this mean, capped at max_tokens; 0: always max_tokens"
    )
    fixed_steps: int = _f(0, "if > 0, every request runs exactly this many steps (the 'fixed' profile)")
    embedding_dim: int = _f(8, "length of the returned embedding vectors")
    speed: float = _f(1.0, "divides every engine time (2 = twice as fast as the profile says)")
    stops_on_cancel: bool = _f(True, "false: a request whose client left runs to the end anyway (its work wasted)")
    health_path: str = _f("/health", "health endpoint path; empty: none (404)")
    api_prefix: str = _f("/v1", "prefix of the OpenAI paths; empty: /chat/completions, /embeddings ... without /v1")
    batching: str = _f("continuous", "continuous (join every step) or padded (static batches, all finish together)")
    frontend_ms: float = _f(
        0.0, "ms a request spends in the HTTP front end before the engine sees it, and again after it ends"
    )
    frontend_spread: float = _f(
        0.0, "0..1: each front-end crossing takes frontend_ms x uniform(1 - spread, 1 + spread) (seeded)"
    )

    def __post_init__(self) -> None:
        for name in ("base_ms", "per_seq_ms", "prefill_ms_per_token", "stop_mean_tokens", "frontend_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("max_num_seqs", "kv_capacity_tokens", "max_model_len", "default_max_tokens", "embedding_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0.0 <= self.frontend_spread <= 1.0:
            raise ValueError("frontend_spread must be within 0..1")
        if self.fixed_steps < 0:
            raise ValueError("fixed_steps must be >= 0")
        if self.chars_per_token <= 0 or self.speed <= 0:
            raise ValueError("chars_per_token and speed must be > 0")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}")
        for name in ("health_path", "api_prefix"):
            value = getattr(self, name)
            if value and (not value.startswith("/") or value.endswith("/") or len(value) > 256):
                raise ValueError(f"{name} must be empty or a path like /health (no trailing slash)")

    @property
    def padded(self) -> bool:
        return self.batching == "padded"

    @property
    def ms_to_s(self) -> float:
        """Multiply profile milliseconds by this to get wall seconds at this speed."""
        return 0.001 / self.speed

    def fixed_capacity_rps(self) -> float:
        """Requests/s the 'fixed' shape sustains: max_num_seqs / (fixed_steps * step_s)."""
        if not self.fixed_steps:
            raise ValueError("capacity is only closed-form for a profile with fixed_steps")
        return self.max_num_seqs / (self.fixed_steps * self.base_ms * self.ms_to_s)

    def with_overrides(self, **overrides) -> Profile:
        """A copy with some fields replaced; None values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


BATCHING = ("continuous", "padded")

PROFILES: dict[str, Profile] = {
    "llm": Profile(),
    "embeddings": Profile(
        name="embeddings",
        model="sim-embeddings",
        base_ms=4.0,
        per_seq_ms=0.05,
        prefill_ms_per_token=0.01,
        max_num_seqs=256,
        kv_capacity_tokens=131_072,
        max_model_len=512,
        default_max_tokens=1,
    ),
    "fixed": Profile(
        name="fixed",
        model="sim-fixed",
        base_ms=10.0,
        per_seq_ms=0.0,
        prefill_ms_per_token=0.0,
        max_num_seqs=32,
        kv_capacity_tokens=1 << 40,
        max_model_len=1 << 30,
        default_max_tokens=16,
        fixed_steps=10,
    ),
    "serial": Profile(
        name="serial",
        model="sim-serial",
        base_ms=20.0,
        per_seq_ms=0.0,
        prefill_ms_per_token=0.5,
        max_num_seqs=1,
        kv_capacity_tokens=1 << 20,
        default_max_tokens=256,
        stops_on_cancel=False,
    ),
    "keeps-computing": Profile(
        name="keeps-computing",
        model="sim-keeps-computing",
        base_ms=25.0,
        per_seq_ms=1.0,
        prefill_ms_per_token=0.05,
        max_num_seqs=8,
        kv_capacity_tokens=1 << 20,
        default_max_tokens=16,
        stops_on_cancel=False,
        batching="padded",
    ),
    "embeddings-serial": Profile(
        name="embeddings-serial",
        model="sim-embeddings",
        base_ms=20.0,
        per_seq_ms=0.0,
        prefill_ms_per_token=0.02,
        max_num_seqs=1,
        kv_capacity_tokens=1 << 30,
        max_model_len=512,
        default_max_tokens=1,
        stops_on_cancel=False,
    ),
    "embeddings-padded": Profile(
        name="embeddings-padded",
        model="sim-embeddings",
        base_ms=10.0,
        per_seq_ms=0.1,
        prefill_ms_per_token=0.02,
        max_num_seqs=32,
        kv_capacity_tokens=1 << 30,
        max_model_len=512,
        default_max_tokens=1,
        stops_on_cancel=False,
        batching="padded",
    ),
}

# Fields a CLI flag may override (everything numeric; name/model stay per profile).
OVERRIDABLE = tuple(f for f in dataclasses.fields(Profile) if f.name not in ("name",))


def get_profile(name: str, **overrides) -> Profile:
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}") from None
    return base.with_overrides(**overrides)
