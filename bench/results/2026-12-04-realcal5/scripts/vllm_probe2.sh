#!/bin/bash
# Under the lock: vLLM (8 seqs); the sidecar's CPU per task at 9 req/s (bench-like, /admin/stats every 1 s).
set -u
cd /work/wt/realcal5
uptime
PORT=8500 MAX_NUM_SEQS=8 /work/shared/servers/vllm_start.sh | tail -1
for i in 1 2 3; do curl -s http://127.0.0.1:8500/v1/chat/completions -H 'content-type: application/json' -d '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":16}' > /dev/null; done
for k in ${KINDS:-base}; do
  rm -f /tmp/rc5/tc_vllm_$k.jsonl
  .venv/bin/python /tmp/rc5/cost.py --upstream http://127.0.0.1:8500 --rps 9 --duration 25 --idle 10 --admin-poll 1 --taskcpu /tmp/rc5/tc_vllm_$k.jsonl 2>&1 | tail -1
done
kill -TERM -- -$(cat ~/.cache/rampmeter-servers/vllm.pid); sleep 3
uptime
