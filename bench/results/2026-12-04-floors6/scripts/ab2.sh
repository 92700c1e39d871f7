#!/bin/bash
# the integration test's scenario (longs only, 10/s, slow 5x for 3 s, budget 1 s), 40 s after recovery
for side in main floors6; do
  if [ $side = main ]; then dir=/tmp/floors6/main_tree; else dir=/work/wt/floors6; fi
  echo "=== $side $(date +%T) $(uptime | sed 's/.*load/load/')"
  (cd $dir && PYTHONPATH=$dir /work/wt/floors6/.venv/bin/python /tmp/floors6/repro_longs.py warm_s=2 slow_s=3 recover_s=40 2>&1 | grep -v "^    ")
done
