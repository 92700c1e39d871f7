#!/bin/bash
# Under the lock: vLLM (8 seqs); sidecar CPU at 9 req/s (80/20, /admin/stats every 1 s as the bench samples),
# old tree (ab5553f) and this branch interleaved, 2 rounds each; per-task CPU by the taskcpu instrument.
set -u
trap 'kill -TERM -- -$(cat ~/.cache/rampmeter-servers/vllm.pid) 2>/dev/null' EXIT
uptime
PORT=8500 MAX_NUM_SEQS=8 /work/shared/servers/vllm_start.sh | tail -1
for i in 1 2 3; do curl -s http://127.0.0.1:8500/v1/chat/completions -H 'content-type: application/json' -d '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":16}' > /dev/null; done
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then D=/tmp/rc5/old; else D=/work/wt/realcal5; fi
    rm -f /tmp/rc5/tcab_${t}_$r.jsonl
    (cd $D && PYTHONPATH=$D /work/wt/realcal5/.venv/bin/python /tmp/rc5/cost.py --upstream http://127.0.0.1:8500 --rps 9 --duration 25 --idle 8 --admin-poll 1 --taskcpu /tmp/rc5/tcab_${t}_$r.jsonl 2>&1 | tail -1 | sed "s/^/$t $r /")
  done
done
kill -TERM -- -$(cat ~/.cache/rampmeter-servers/vllm.pid); sleep 3
uptime
