#!/bin/bash
for b in 1 2; do python3 -c "while True: pass" & echo $! >> /tmp/rc5/burners.pids; done
uptime
cd /work/wt/realcal5
for i in $(seq 8); do .venv/bin/python -m pytest -q -n 0 -p no:randomly "tests/integration/test_real_habits_e2e.py::test_the_engine_queue_limit_leaves_room_for_what_the_servers_front_end_holds" 2>&1 | tail -1; done
uptime
for p in $(cat /tmp/rc5/burners.pids); do kill $p; done; rm -f /tmp/rc5/burners.pids
