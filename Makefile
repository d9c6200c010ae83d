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

clean-build:
	rm -rf build
