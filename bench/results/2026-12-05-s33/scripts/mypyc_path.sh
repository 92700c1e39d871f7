#!/usr/bin/env bash
# Compile the whole request path with mypyc in a scratch checkout (never in the real tree: a built .so beside
# its .py shadows it): stop 31's 22 proxy/core modules (bench/results/2026-12-05-s31/scripts/mypyc_core.sh)
# plus the runtime and http modules a request goes through, but proxy/runtime/scheduler.py: compiled, its
# queued wait failed (mypyc keeps mypy's narrowing of `waiter.result` to None across the await that changes it,
# and its runtime check raised TypeError). Usage: mypyc_path.sh CHECKOUT. Modules left interpreted: decisions (exceptions,
# and interpreted Value subclasses), values (its subclasses in decisions stay interpreted), and every
# module that defines an exception or is not on the request path.
set -euo pipefail
cd "$1"
PY=/work/main/.venv/bin/python
# mypyc needs the _FIELDS alias as its own statement, and a real import where the class is used at run time.
# phantoms.py's Lease annotation is read at import by mypyc's native attributes: import it for real.
sed -i 's/^    from proxy.core.decisions import Lease$/    pass\nfrom proxy.core.decisions import Lease  # noqa: E402/' proxy/core/phantoms.py
sed -i 's/^    __slots__ = _FIELDS = \((.*)\)$/    _FIELDS = (\1)\n    __slots__ = _FIELDS/' proxy/core/deadline.py
MODS="admission arrival balancer capacity censored codel cost deadline load limits phantoms quantiles rates request_ids retry_after service_model shedding sjf slow_start token_bucket waitline warmup"
FILES="$(for m in $MODS; do echo proxy/core/$m.py; done) proxy/runtime/request_path.py proxy/runtime/relay.py proxy/runtime/edge.py proxy/runtime/classify.py proxy/runtime/observe.py proxy/runtime/fields.py proxy/runtime/passthrough.py proxy/http/forward.py"
mv pyproject.toml pyproject.toml.aside   # its mypy overrides name modules this build does not see
trap 'mv pyproject.toml.aside pyproject.toml' EXIT
$PY -m mypyc $FILES 2>&1 | tail -20
ls proxy/*/*.so | wc -l
