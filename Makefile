# The two commands of the README:
#   make lab   - set up (once) and start JupyterLab on notebooks/ (each notebook starts a real Triton)
#   make test  - set up (once) and run every test, notebooks included
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup lab test bench clean-build

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	@touch $(STAMP)

# Idempotent: builds models and backends only when they are missing or stale.
setup: $(STAMP)
	$(VENV)/bin/lab-backends setup

lab: setup
	$(VENV)/bin/lab-backends lab

test: setup
	$(PY) -m pytest tests
	$(PY) -m pytest --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=60 notebooks

clean-build:
	rm -rf build

# The batching benchmark (not a test): bench/batching.csv, bench/loadgen.csv, bench/batching.png.
# wrk (Debian package) is the reference HTTP load generator; installed here when missing.
# BENCH_ARGS=--quick for the short version (under 3 minutes).
bench: setup
	@command -v wrk >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then apt-get install -y wrk || { apt-get update && apt-get install -y wrk; }; else sudo apt-get install -y wrk; fi; }
	$(VENV)/bin/lab-backends bench batching $(BENCH_ARGS)
