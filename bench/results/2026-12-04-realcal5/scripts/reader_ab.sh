#!/bin/bash
# The metrics reader's CPU per read (trio-task accounting), old tree vs this one, idle sidecar in front of
# the static vLLM-sized page (50,364 bytes); N rounds interleaved.
SECS=${SECS:-30}
one() {  # $1: tree, $2: label
  POL=$(mktemp -d)/p.toml
  sed -e 's|^url = ".*"|url = "http://127.0.0.1:18901"|' /work/main/bench/results/2026-12-01-realcal4/run1/vllm.policy.toml | sed "/^\[\[warmup.probes\]\]/,/^count = 8/d" | sed "s|^upstream_metrics_interval_s = .*|upstream_metrics_interval_s = ${INTERVAL:-1.0}|" > $POL
  OUT=/tmp/rc5/reader_ab_$2.jsonl; rm -f $OUT
  (cd $1 && PYTHONPATH=$1 /work/wt/realcal5/.venv/bin/python /tmp/rc5/taskcpu.py $OUT serve --listen 127.0.0.1:0 --admin 127.0.0.1:0 --policy $POL --log-level error > /dev/null 2>&1) &
  sleep 4; PID=$(pgrep -n -f "taskcpu.py $OUT")
  kill -USR1 $PID; C0=$(awk '{print $14+$15}' /proc/$PID/stat); sleep $SECS; C1=$(awk '{print $14+$15}' /proc/$PID/stat); kill -USR1 $PID; sleep 0.2
  kill -INT $PID; wait
  python3 - "$OUT" "$2" "$SECS" "$((C1-C0))" <<'PY'
import json, sys
d = [json.loads(l) for l in open(sys.argv[1])][1]
r = d["cpu_ms"].get("proxy.runtime.upstream_metrics.UpstreamMetricsReader.run", 0); secs = float(sys.argv[3])
tot = sum(d["cpu_ms"].values())
print(f"{sys.argv[2]:6s} reader {r/secs:.2f} ms/s; trio thread {tot/secs:.1f} ms/s; /proc {int(sys.argv[4])*10/secs:.1f} ms/s")
PY
}
for i in $(seq ${N:-2}); do one /tmp/rc5/old before; one /work/wt/realcal5 after; done
