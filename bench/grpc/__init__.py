"""`python -m bench.grpc [--quick]`: unary gRPC direct vs through rampmeter, and gRPC under overload.

Question: what does the sidecar cost a gRPC client, and does it keep goodput and tell gRPC
clients when to come back once the servicer is overloaded? (issue 17)

Setup: a grpcio servicer (proxy/testing/grpc_servicer.py) in its own process on CPU 1, the
sidecar (`rampmeter serve --upstream-protocol h2c`, gRPC health) on CPU 0, and the load
generator, an asynchronous grpcio client (grpc.aio), in this process on CPU 1, apart from the
proxy. Configurations are interleaved (direct, sidecar, direct, sidecar, ...).

- identical: unary, server streaming, an error status with details and trailing metadata,
  compared direct and through the sidecar (status, message, trailers, payload).
- fixed rate: unary calls at each of `RATES` calls/s, open loop: p50/p99 of each, the added
  p50/p99, and the sidecar's CPU microseconds per call (utime + stime of its process). The
  target is at 500 calls/s; the lower rate shows what is added where the sidecar's core is not
  saturated (on the shared 2-core machine it is, at 500).
- max calls/s: closed loop, `CONCURRENCY` calls in flight, calls/s direct and via.
- overload: the servicer's Sleep method serves `SLOTS` calls at once, `SLEEP_MS` each
  (capacity SLOTS / SLEEP_MS); the sidecar's limit is SLOTS and its queue is short
  (OVERLOAD_POLICY: a queue wait beyond a few service times is refused with UNAVAILABLE and a
  pushback rather than served late). Peak goodput is measured closed
  loop through the sidecar, the better of SLOTS and 2 x SLOTS calls in flight (the second keeps
  its queue full, so its dispatch is measured too); then 2x capacity is offered open loop by
  clients whose gRPC retry policy retries UNAVAILABLE (a 10 ms backoff of its own, so the wait
  it keeps is the sidecar's grpc-retry-pushback-ms). Reported: goodput / peak, and the share of
  rejected attempts the client retried (the sidecar's rejections minus the calls that ended
  rejected, over the sidecar's rejections). The same offered load direct, beside it, and
  through the sidecar by clients without a retry policy (what the retries themselves cost).
- `--triton`, `--mlserver` (with `--triton-only`: those alone; `--triton-only` by itself is
  PyTriton): real KServe v2 servers from the recipes of ../shared/servers (bench/grpc/triton.py):
  Triton 2.51 in PyTriton (KServe v2 gRPC on :8001, gRPC health) and MLServer 1.7.1 (:8081, no
  gRPC health: the sidecar asks its HTTP /v2/health/ready on :8080, the policy's other choice),
  model "tiny" with batches up to 16, called with ModelInfer: identical results by
  tritonclient[grpc] direct and through the sidecar (model metadata, outputs, an unknown model's
  status and message) with policies/triton-grpc.toml; the added p50/p99 at TRITON_RATE calls/s
  (10 ms per batch); and the overload case as above at 200 ms per batch (capacity 16 / 0.2 s =
  80 calls/s, 160 offered), the sidecar's limit two batches (MLServer's batcher cuts batches by
  arrival time: limits.dispatch_batch = 16 for it, as docs/grpc.md says). Both servers keep computing calls
  whose client gave up, so each overload case first waits until the server holds none
  (`RealServer.wait_idle`, from its metrics or a probe call), and the direct case, which
  leaves thousands of abandoned calls, runs last.

`--keep-awake`: a SCHED_IDLE busy loop on the sidecar's core (CPU 0) for the run, so it never
halts between calls (bench.common.keep_awake; bench.overhead's doc says why: on these VMs waking a
halted vCPU is slow now and then). It measures what the sidecar adds where its core does not
sleep; run without it too and give both.
"""

NAME = "grpc"
RATE = 500
RATES = (100, 500)
CONCURRENCY = 32
SLOTS = 4
SLEEP_MS = 50
