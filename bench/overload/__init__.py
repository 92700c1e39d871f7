"""bench/overload: past capacity, does rampmeter keep goodput up and the engine busy with useful work?

Theory of operation. One simulated pod (llm profile at --speed 0.5, a batch of 16
sequences, seed 1) is reached three ways: `direct`; through a sidecar with
bench/policies/overload-admission-only.toml (`admission_only`: the same SJF admission
and concurrency limit, no shedding, unbounded queues, no early expiry); and through a
sidecar with bench/policies/overload-full.toml (`full`: the defaults). The workload is
two client populations, open loop, Poisson: interactive chat (~100 prompt tokens, 32
output; 75% of requests) with 2 s deadlines, and batch chat (~400 prompt, 128 output)
with 10 s deadlines. The clients behave like real ones: each sends its budget as
x-request-timeout-ms and gives up (disconnects) when its deadline passes; each class is
a load-generator target of its own (the generator's timeout is per target), the two run
side by side. The pod's capacity for this mix is computed in closed form
(`capacity_rps`); steps go from 0.5x to 2.5x of it, and at each step the three
configurations run in turn on the same seeded traces (interleaved, so drift on a shared
machine hits all three alike). Sidecars run on CPU 0, the pod and the generator on CPU 1.

Modules: `pod` (the pod behind a budget tap, in a child process), `step` (one
configuration at one step, the counters around its measured window, the latency
controls), `report` (figures, targets, Markdown, plot), `__main__` (the sweep).

Usage: python -m bench.overload [--quick] [--out DIR]
"""

from __future__ import annotations

from proxy import loadtest as lt
from proxy.loadtest.shapes import chat_body
from proxy.simpod import get_profile, oracle

NAME = "overload"
CHAT = "/v1/chat/completions"
POD_PROFILE = get_profile("llm", speed=0.5, max_num_seqs=16)
POD_SEED = 1
SHAPES = (
    lt.Shape("interactive_chat", CHAT, chat_body(100, 32), cls="interactive", deadline_ms=2_000, weight=3),
    lt.Shape("batch_chat", CHAT, chat_body(400, 128), cls="batch", deadline_ms=10_000, weight=1),
)
CONFIGS = ("direct", "admission_only", "full")
POLICIES = {
    "admission_only": "bench/policies/overload-admission-only.toml",
    "full": "bench/policies/overload-full.toml",
}
FULL_LOADS, QUICK_LOADS = (0.5, 1.0, 1.5, 2.0, 2.5), (1.0, 2.0)
TARGET_LOAD = 2.0


def capacity_rps(profile=POD_PROFILE, shapes=SHAPES) -> float:
    """Requests/s the engine completes with a full batch of this mix.

    Every step advances all max_num_seqs sequences by one token, so requests finish (and
    new ones are admitted and prefilled) at max_num_seqs / mean steps, per step. SJF and
    class priority change the mix that is served, so goodput can exceed this figure.
    """
    total = sum(s.weight for s in shapes)
    jobs = [(s.weight / total, oracle(s.path, s.body, profile, POD_SEED)) for s in shapes]
    per_step = profile.max_num_seqs / sum(w * o.steps for w, o in jobs)
    prefill_ms = profile.prefill_ms_per_token * sum(w * o.prompt_tokens for w, o in jobs) * per_step
    step_ms = profile.base_ms + profile.per_seq_ms * profile.max_num_seqs + prefill_ms
    return per_step / (step_ms * profile.ms_to_s)
