#!/bin/bash
# main (eb9be23) and floors6 interleaved on the slow-then-fast sim-pod scenario
for i in 1 2; do
  for side in main floors6; do
    if [ $side = main ]; then dir=/tmp/floors6/main_tree; else dir=/work/wt/floors6; fi
    echo "=== $side run $i $(date +%T) $(uptime | sed 's/.*load/load/')"
    (cd $dir && PYTHONPATH=$dir /work/wt/floors6/.venv/bin/python /tmp/floors6/repro.py warm_s=3 slow_s=4 recover_s=25 2>&1 | grep -v "^    ")
  done
done
