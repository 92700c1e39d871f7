#!/usr/bin/env bash
# Compile the whole request path with mypyc in a scratch checkout (never in the real tree: a built .so beside
# its .py shadows it): stop 31's 22 proxy/core modules (its mypyc_core.sh, which this calls) plus the runtime
# and http modules a request goes through, but proxy/runtime/scheduler.py: compiled, its queued wait failed
# (mypyc keeps mypy's narrowing of `waiter.result` to None across the await that changes it, and its runtime
# check raised TypeError). Usage: mypyc_path.sh CHECKOUT.
set -euo pipefail
exec bash "$(dirname "$0")/../../2026-12-05-s31/scripts/mypyc_core.sh" "$1" \
    proxy/runtime/request_path.py proxy/runtime/relay.py proxy/runtime/edge.py proxy/runtime/classify.py \
    proxy/runtime/observe.py proxy/runtime/fields.py proxy/runtime/passthrough.py proxy/http/forward.py
