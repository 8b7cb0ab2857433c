# tirjax set-up and entry points. `make test` and `make run` create .venv on first use.
# .venv needs Python >= 3.12 (jax >= 0.11 and flax >= 0.12.9 require it): unless PYTHON is
# given, the first of python3, python3.12, python3.13 and pyenv's 3.12+ that runs and is one.
# (Python 3.11 still works with jax 0.10 by hand: pip install -r requirements.txt.)
# The first of the interpreters $(2) for which the Python expression $(1) is true.
python_where = $(firstword $(foreach p,$(2),$(shell $(p) -c 'import sys; print($(1))' \
  2>/dev/null | grep -qx True && echo $(p))))
comma := ,
PYENV_VERSIONS := $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions
PYTHON_CANDIDATES := python3 python3.12 python3.13 \
  $(wildcard $(PYENV_VERSIONS)/3.1[2-9]*/bin/python3)
ifndef PYTHON
PYTHON := $(call python_where,sys.version_info >= (3$(comma) 12),$(PYTHON_CANDIDATES))
endif
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
PY := $(VENV)/bin/python

.PHONY: setup vllm-env test test-fast test-compat run bench gpu-wheels clean-venv check-python

# A clear stop where no Python 3.12+ was found, or PYTHON names an older one.
check-python:
	@test -n "$(PYTHON)" || { echo "tirjax's .venv needs Python >= 3.12 (jax >= 0.11) and none" \
	  "was found among: $(PYTHON_CANDIDATES). Install one (e.g. pyenv install 3.12)" \
	  "or give it: make PYTHON=/path/to/python3.12" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))' || { echo "PYTHON=$(PYTHON)" \
	  "is not Python >= 3.12, which tirjax's .venv needs (jax >= 0.11)" >&2; exit 1; }

# An existing .venv of an older Python (made before jax 0.11) is made anew; pip then installs
# into the current one.
$(VENV)/.installed: $(REQUIREMENTS) requirements.txt requirements-test.txt requirements-wandb.txt \
  setup.py | check-python
	$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
	  || $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(REQUIREMENTS) -r requirements-test.txt
	$(PY) -m pip install -q --no-deps bfcl-eval==2026.3.23 mpmath tree_sitter==0.21.3 \
	  tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4 "tenacity>=8.5,<10"
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed

# The vLLM sampler's own environment (vLLM pins its own torch and transformers). uv resolves and
# installs it in about 30 s; the torch CPU wheel comes from pip's find-links location (set
# VLLM_FIND_LINKS where pip has none). It stays on Python 3.11, the Python of this machine's
# local torch 2.13.0+cpu wheel (PyPI has no CPU build of torch for Linux): VLLM_PYTHON is the
# first Python 3.11 found among python3.11, python3 and pyenv's 3.11, unless given.
VLLM_VENV ?= .venv-vllm
VLLM_REQUIREMENTS ?= requirements-vllm.txt
VLLM_PYTHON_CANDIDATES := python3.11 python3 $(wildcard $(PYENV_VERSIONS)/3.11*/bin/python3)
VLLM_PYTHON ?= $(call python_where,sys.version_info[:2] == (3$(comma) 11),$(VLLM_PYTHON_CANDIDATES))
VLLM_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),\
  $(shell $(or $(VLLM_PYTHON),python3) -m pip config get global.find-links 2>/dev/null))

$(VLLM_VENV)/.installed: $(VLLM_REQUIREMENTS) requirements-vllm-exclude.txt
	@test -n "$(VLLM_PYTHON)" || { echo ".venv-vllm needs Python 3.11 (the local torch CPU" \
	  "wheel's) and none was found among: $(VLLM_PYTHON_CANDIDATES); give one:" \
	  "make VLLM_PYTHON=/path/to/python" >&2; exit 1; }
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q "uv>=0.13,<0.14"
	$(VLLM_VENV)/bin/uv pip install -q --python $(VLLM_VENV)/bin/python \
	  $(if $(VLLM_FIND_LINKS),--find-links $(VLLM_FIND_LINKS)) \
	  --excludes requirements-vllm-exclude.txt -r $(VLLM_REQUIREMENTS)
	touch $@

vllm-env: $(VLLM_VENV)/.installed

# The embedded default: the tiny model on toolworld with the built-in JAX sampler, SFT warm-start
# then RL with HiDiffTIR; prints eval accuracy, steps, unanswerable rate and formatting reward
# after SFT and after RL. Rerunning with the same RUN_DIR resumes (or reprints a finished run).
RUN_CONFIG ?= configs/hidifftir.py:model=tiny
RUN_DIR ?= runs/default

run: setup
	$(PY) -m experiments.train --config=$(RUN_CONFIG) --workdir=$(RUN_DIR)

# --max-worker-restart=0: a worker that crashes (a segfault) fails its test and ends the run;
# xdist 3.8 replacing it under --dist loadgroup hangs instead (KeyError in its scheduler).
XDIST = -n 2 --dist loadgroup --max-worker-restart=0

test: setup vllm-env
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The inner loop: everything but the vLLM tests and those marked slow, with fewer hypothesis
# examples (under 3 minutes on 2 cores, no vLLM environment). `make test` stays the CI command
# and runs everything.
test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow and not vllm" --hypothesis-profile=fast \
	  $(PYTEST_ARGS)

# The GPU machine's image, checked here: .venv-compat with its recorded versions
# (requirements-compat.txt; Python 3.12, jax 0.11.2), then `make test-fast` and
# benchmarks/gpu/run.sh --dry-run in it, the latter with the packages the image lacks blocked
# and .whl/ installed as on the GPU; results in benchmarks/results/compat.json. Not part of
# `make test`: CI's time goes to the main suite.
COMPAT_VENV ?= .venv-compat
COMPAT_PYTHON ?= $(call python_where,sys.version_info[:2] == (3$(comma) 12),$(PYTHON_CANDIDATES))

test-compat: gpu-wheels
	@test -n "$(COMPAT_PYTHON)" || { echo "make test-compat needs Python 3.12 (the GPU image's)" \
	  "and none was found among: $(PYTHON_CANDIDATES); give one: make test-compat" \
	  "COMPAT_PYTHON=/path/to/python3.12" >&2; exit 1; }
	$(MAKE) setup VENV=$(COMPAT_VENV) PYTHON=$(COMPAT_PYTHON) REQUIREMENTS=requirements-compat.txt
	$(COMPAT_VENV)/bin/python -m experiments.studies.compat --venv=$(COMPAT_VENV) \
	  --json=benchmarks/results/compat.json

bench: setup
	$(PY) -m benchmarks.bench_kernels --json=benchmarks/results/bench_kernels_cpu.json

# The pure-Python wheels (and rpds-py's manylinux CPython 3.12 build) that the GPU machine's
# image lacks, for benchmarks/gpu/run.sh there: the sampler section imports jsonschema.
GPU_WHEELS ?= jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
  rpds-py==2026.9.1 attrs==26.1.0 typing-extensions==4.15.0

gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 -d .whl $(GPU_WHEELS)
	@du -sh .whl

clean-venv:
	rm -rf $(VENV)
