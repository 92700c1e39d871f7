#!/usr/bin/env bash
# Scratch: the sim pod standing in for vLLM (llm profile, batch of 8), for fast scheduling experiments.
set -euo pipefail
D=${SERVERS_DIR:-$HOME/.cache/rampmeter-servers}; PORT=${PORT:-8500}
setsid /work/main/.venv/bin/rampmeter sim-pod --listen 127.0.0.1:$PORT --profile llm --max-num-seqs ${MAX_NUM_SEQS:-8} \
  --base-ms ${SIM_BASE_MS:-2.5} --per-seq-ms 0.1 --model tiny --log-level warning > /tmp/s28/sim.log 2>&1 < /dev/null &
PID=$!; echo "$PID" > $D/vllm.pid
for i in $(seq 1 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" && { echo "sim up pid=$PID"; exit 0; }
  sleep 0.2
done; exit 1
