#!/bin/bash
# one locked vLLM run of bench.real_servers with the budget fixed by hand on both sides
cd /work/wt/floors6
out=bench/results/2026-12-04-floors6/$1
mkdir -p $out
echo "start $(date +%T) $(uptime)" > $out/uptime.txt
timeout 590 .venv/bin/python -m bench.real_servers --quick --servers vllm --repeats 3 --duration-s 10 --budget-ms $2 --out $out > $out/stdout.txt 2>&1
echo "rc $?" >> $out/uptime.txt
echo "end $(date +%T) $(uptime)" >> $out/uptime.txt
