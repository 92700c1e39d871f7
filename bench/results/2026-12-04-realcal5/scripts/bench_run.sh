#!/bin/bash
# One locked run of bench.real_servers on vLLM; $1: run name, rest: extra args
cd /work/wt/realcal5
R=bench/results/2026-12-04-realcal5/$1; shift
{ uptime; date; git rev-parse --short HEAD; git status --short | head -5; echo "args: $*"; } > $R.meta.txt
timeout 660 .venv/bin/python -m bench.real_servers --quick --servers vllm --out $R "$@" > $R.stdout.txt 2>&1
echo "rc $?" >> $R.meta.txt
{ uptime; date; } >> $R.meta.txt
