# trainpipe: `make demo` and `make test` work on a fresh machine with Python 3.11.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# pip's cache lives outside the clone (~/.cache/pip), so CI and reruns reuse downloads.
STAMP  := $(VENV)/.installed-dev

.PHONY: all install dev demo test test-fast compile clean

all: test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

# One install for demo and tests: the dev extra pulls every runtime extra.
# torch is pinned (==2.13.0) in pyproject.toml: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[dev]'
	touch $(STAMP)

install dev: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trainpipe demo --engine kfp-local

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "unit or contract"

compile: $(STAMP)
	$(VENV)/bin/trainpipe compile --profile cpu -o build/pipeline-cpu.yaml
	$(VENV)/bin/trainpipe compile --profile gpu -o build/pipeline-gpu.yaml

clean:
	rm -rf build .trainpipe .pytest_cache
