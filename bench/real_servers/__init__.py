"""Real model servers direct and through rampmeter with the policy `rampmeter calibrate` wrote for each.

`python -m bench.real_servers [--quick] [--servers vllm,litserve,pytriton] [--out DIR]`

Theory of operation, per server (servers.py): install it from its recipe in
../shared/servers if its venv is missing, start it, run `rampmeter calibrate`
on it (in this process, so every figure is kept), write the policy, start a
sidecar with that policy, then run the cases of cases.py interleaved direct /
sidecar on the same seeded traces, and stop everything. Targets (issue 12):

- zero sheds in a closed loop the backend can serve within the deadlines;
- goodput through rampmeter >= direct's at 2 x capacity;
- backend work after the load stops <= 1 s (direct's figure is the yardstick);
- on vLLM, short p50 >= 2 x lower than direct at the same throughput.

Some of these depend on admission features (phantom leases for servers that keep
computing, the engine-queue limit, scale-free shedding) that land on another
branch; the benchmark runs without them and reports what it measured.
Real servers are never part of `make test`.
"""
