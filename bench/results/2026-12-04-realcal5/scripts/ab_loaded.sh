#!/bin/bash
# old/new interleaved, each with 3 CPU burners beside it (CI runs tests in parallel on 2 cores)
N=${1:-3}
for b in 1 2 3; do python3 -c "while True: pass" & echo $! >> /tmp/rc5/burners.pids; done
uptime
for i in $(seq $N); do
  echo "== old $i"; (cd /tmp/rc5/old && PYTHONPATH=. /work/wt/realcal5/.venv/bin/python /tmp/rc5/frontend_e2e.py 1 2>&1 | grep "^{")
  echo "== new $i"; (cd /work/wt/realcal5 && .venv/bin/python /tmp/rc5/frontend_e2e.py 1 2>&1 | grep "^{")
done
uptime
for p in $(cat /tmp/rc5/burners.pids); do kill $p; done; rm -f /tmp/rc5/burners.pids
