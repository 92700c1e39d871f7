#!/usr/bin/env bash
# Compile proxy/core's per-request modules with mypyc in a scratch checkout (never in the real tree: a built
# .so beside its .py shadows it). Usage: mypyc_core.sh CHECKOUT [MORE.py ...] (more modules compiled with them:
# stop 33's mypyc_path.sh). Modules left interpreted: decisions (exceptions,
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
FILES="$(for m in $MODS; do echo proxy/core/$m.py; done) ${*:2}"
mv pyproject.toml pyproject.toml.aside   # its mypy overrides name modules this build does not see
trap 'mv pyproject.toml.aside pyproject.toml' EXIT
$PY -m mypyc $FILES 2>&1 | tail -20
ls proxy/*/*.so | wc -l
