# The two commands a newcomer needs: `make demo` and `make test`.
# Both bootstrap .venv themselves; nothing relies on what was installed by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test demo lint typecheck bench bench-quick bench-deps policy-docs dashboard tools clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Two workers, a test file each at a time (module fixtures stay whole): most tests wait on real
# processes and sockets, so this halves the run on CI's 2 cores (12 -> 6 min). PYTEST_WORKERS=0: serial.
PYTEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

demo: setup
	$(PY) -m proxy.testing.demo

lint: setup
	$(PY) -m ruff check proxy client_sdk tests bench
	$(PY) -m ruff format --check proxy client_sdk tests bench

# Strict for proxy/core, proxy/policy and client_sdk, default elsewhere ([tool.mypy] in pyproject.toml).
typecheck: setup
	$(PY) -m mypy proxy client_sdk

# Validators the monitoring and policy tests run, in a venv of their own (.ci/run adds its bin/ to PATH):
# kubernetes-validate (manifests), check-jsonschema and taplo (policies against the shipped schema).
TOOLS := .venv-tools
tools: $(TOOLS)/.installed

$(TOOLS)/.installed: Makefile
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q kubernetes-validate==1.37.0 check-jsonschema==0.39.0 taplo==0.9.3
	touch $@

dashboard:
	$(PYTHON) examples/kubernetes/dashboard.py > examples/kubernetes/grafana-dashboard.json

# The policy reference, the commented defaults and the JSON Schema editors read, all from the schema.
policy-docs: setup
	$(PY) -m proxy.policy.reference > docs/policy-reference.md
	$(PY) -m proxy.policy.reference --toml > policies/default.toml
	$(PY) -m proxy.policy.reference --schema > policies/policy.schema.json

bench-deps:
	@command -v h2load >/dev/null && command -v nginx >/dev/null && command -v haproxy >/dev/null \
	  && command -v redis-server >/dev/null && command -v wrk >/dev/null \
	  || (echo "installing benchmark tools with apt (nghttp2-client nginx haproxy redis-server wrk)"; \
	      apt-get install -y -qq nghttp2-client nginx haproxy redis-server wrk)

bench-quick: setup bench-deps
	for b in overhead loadtest_accuracy scheduling overload dedup retry_storm coldstart microbatch; do \
	  $(PY) -m bench.$$b --quick || exit 1; done

bench: setup bench-deps
	for b in overhead loadtest_accuracy scheduling overload dedup retry_storm coldstart microbatch; do \
	  $(PY) -m bench.$$b || exit 1; done

clean:
	rm -rf $(VENV) $(TOOLS) build dist *.egg-info bench/results demo-out
