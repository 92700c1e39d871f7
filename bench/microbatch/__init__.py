"""Does micro-batching in the sidecar pay? Direct vs rampmeter with batching off and on, open loop at rising rates.

Setups (issue 19):

A. `serial`: the sim pod's embeddings-serial profile (an encoder server that does
   not batch: one call at a time, 20 ms a call + 0.02 ms a token), the
   loadtest's embed_short shape (~32 tokens). Targets, interleaved step by step on
   one seeded Poisson trace: direct, rampmeter with batching off (unbatched
   forwarding), batching on (max_wait_ms 10) and batching on with adaptive = true.
   Rates are multiples of the direct capacity C0 = 1 / service time of one call
   (exact for this profile); a target leaves the sweep after its first step that
   misses the SLA (p99 <= SLA_MS, <= 1% failed). Reported: the highest rate each
   target sustained within the SLA (goodput), and p50/p99 at 0.8 x C0.
   Targets: batching on sustains >= 4x direct's rate within the SLA; its p99 at
   0.8 x C0 is no worse than direct's.
B. `padded`: the embeddings-padded profile (a server that batches internally up
   to 32 calls, padding every call to the batch's longest prompt), 80% embed_short
   / 20% embed_long (~400 tokens). Direct, batching off (unbatched forwarding),
   batching on with length buckets [64] (grouped) and with one bucket. Target:
   grouped lowers short-input p50 by >= 2x against unbatched forwarding. Padding
   saved: the sidecar's batch_padding_* counters.
C. `litserve`: a real server configured not to batch: LitServe 0.2.19 with
   max_batch_size=1 serving /v1/embeddings (bench/microbatch/litserve_embed.py,
   one forward pass = 20 ms + 0.02 ms a token, slept in its worker), the recipe's
   venv (../shared/servers/litserve_setup.sh). Direct, off, on, at a few rates;
   reported beside the sim pod, no target (its HTTP stack, not only its model,
   sets its capacity).

CPU: the pod (or LitServe) on CPU 0, the sidecars and this generator on CPU 1;
each sidecar's CPU microseconds per request (/proc/PID/stat) is reported per step.
Usage: python -m bench.microbatch [--quick] [--out DIR] [--skip-litserve]
"""
