# tirjax set-up and entry points. `make test` and `make run` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test run bench clean-venv

$(VENV)/.installed: requirements.txt requirements-test.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install -q --no-deps bfcl-eval==2026.3.23 mpmath
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup

bench: setup
	$(PY) -m experiments.bench_kernels --json=benchmarks/results/bench_kernels_cpu.json

clean-venv:
	rm -rf $(VENV)
