# trainpipe: `make demo` and `make test` work on a fresh machine with Python 3.11.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# pip's cache lives outside the clone (~/.cache/pip), so CI and reruns reuse downloads.
STAMP  := $(VENV)/.installed-dev
# Horovod 0.28.1 is built once (C++17 fix, PyTorch binding, gloo) into a wheel cache
# outside the clone; every later venv installs that wheel.
WHEELHOUSE ?= $(HOME)/.cache/trainpipe/wheels
HOROVOD_WHEEL := $(WHEELHOUSE)/horovod-0.28.1-cp311-cp311-linux_x86_64.whl
HOROVOD_STAMP := $(VENV)/.installed-horovod

.PHONY: all install dev horovod browser monitoring slurm podman demo demo-smb test test-cuda test-fast test-images test-lowest test-lowest-torch lint docs audit format bench compile golden component training-function lock images push clean

all: test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

# One install for demo and tests: the dev extra pulls every runtime extra. torch is held to the
# CPU wheel on disk by images/torch.txt (the library itself admits a range): another version, or an
# unpinned torch, pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml images/constraints.txt images/torch.txt | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[dev]' -c images/constraints.txt -c images/torch.txt
	touch $(STAMP)

install dev: $(STAMP)

# Building needs torch importable (no build isolation), so it uses the dev venv.
$(HOROVOD_WHEEL): | $(STAMP)
	scripts/build_horovod_wheel.sh $(PY) $(WHEELHOUSE)

$(HOROVOD_STAMP): $(HOROVOD_WHEEL) $(STAMP)
	$(PIP) install --quiet --find-links $(WHEELHOUSE) 'horovod==0.28.1'
	touch $(HOROVOD_STAMP)

horovod: $(HOROVOD_STAMP)

# The report tests open the HTML reports in headless Chromium: Debian's package (Playwright
# drives it; its own browser download is never used).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }

# The telemetry tests start Prometheus and the Pushgateway by hand on free loopback ports (never as
# system services): Debian's packages give the binaries. monitoring/podmonitor.yaml is validated
# offline with the validators generated from prometheus-operator's CRDs (an npm package, installed
# once outside the clone).
NPM_PREFIX ?= $(HOME)/.cache/trainpipe/npm
PODMONITOR_MODELS := $(NPM_PREFIX)/node_modules/@kubernetes-models/prometheus-operator/package.json

$(PODMONITOR_MODELS):
	npm install --silent --no-audit --no-fund --prefix $(NPM_PREFIX) @kubernetes-models/prometheus-operator@6.0.0

monitoring: $(PODMONITOR_MODELS)
	@command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends prometheus prometheus-pushgateway; }

# The Slurm tests start munged, slurmctld and slurmd by hand on free loopback ports with their own
# config (never as system services): Debian's packages give the binaries.
slurm:
	@command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null || { \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; }

# make images builds with podman (images/containers.conf holds its settings for this kind of machine: runc, cgroupfs,
# file events, ulimits) and makes its own Debian base with debootstrap where no registry serves the pinned one.
podman:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || { \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends podman runc fuse-overlayfs uidmap \
		slirp4netns debootstrap; }

demo: $(STAMP)
	$(VENV)/bin/trainpipe demo --engine kfp-local

# The same demo for a small business's CPU server: the model is also exported to ONNX, quantized to
# int8 and pruned, and the fastest variant within half a point of accuracy is registered beside it.
demo-smb: $(STAMP)
	$(VENV)/bin/trainpipe demo --engine kfp-local --profile cpu-smb --workspace .trainpipe/demo-smb

# Two pytest workers, each test file on one of them (its module fixtures set up once): most tests
# drive one subprocess at a time and leave the second core idle. The files go out longest first (the
# root conftest.py orders them by tests/durations.json; --no-loadscope-reorder keeps that order) so the
# workers end together. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2

test: $(STAMP) $(HOROVOD_STAMP) browser monitoring slurm
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not images"

# The images tier (tests/images): each component in the image make images built, as a pod runs it, and the
# reference pipeline on kfp.local.DockerRunner through podman's socket. Skipped, with the reason, where this
# machine cannot run containers; under CI (CI=true) that fails instead.
test-images: images
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests/images -m images

# Ratios against baselines measured in the same run; writes bench/results/<date>.json and prints
# the markdown table the README shows. BENCH_ARGS="--repeats 5" for more repeats.
bench: $(STAMP) $(HOROVOD_STAMP)
	$(PY) bench/run.py $(BENCH_ARGS)

# Static checks, offline: ruff (lint and format, configured in pyproject.toml), import-linter's layer
# contracts ([tool.importlinter]) on the package as pip installs it (the folders pyproject's package-dir
# maps into one namespace form one tree only there), the components' settings tables against their specs,
# and hadolint on the Dockerfile. CI runs it. `make format` applies ruff's fixes and format.
LINT_SITE ?= build/lint-site

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf $(LINT_SITE) build/lib  # setuptools' build/lib would keep a removed module in the wheel
	mkdir -p $(dir $(LINT_SITE))
	$(PIP) install --quiet --no-deps --no-build-isolation --target $(LINT_SITE) . > $(LINT_SITE).log 2>&1 || { cat $(LINT_SITE).log; exit 1; }
	PYTHONPATH=$(LINT_SITE) $(VENV)/bin/lint-imports --no-cache pyproject.toml
	$(PY) scripts/mypy_baseline.py $(LINT_SITE)  # types: a baseline of errors per file that only goes down
	$(PY) scripts/settings_tables.py --check
	$(VENV)/bin/hadolint images/Dockerfile

# pip-audit of every pinned requirement (the test venv's constraints and the image locks) against
# PyPI's advisory database; exceptions need a written reason in images/audit-exceptions.txt. It needs
# PyPI's JSON API, which CI's network (package downloads only) does not reach: exits 75 there. Run it
# before a release and after `make lock`.
audit: $(STAMP)
	$(PY) scripts/audit_deps.py

# The unit and contract tests on the lowest versions pyproject's ranges admit: uv's lowest-direct
# resolution (every requirement trainpipe names at its lower bound, what they need at the newest that
# fits) into a virtualenv of its own. Not in CI: a second full install (torch 2.6's CUDA build, 3 GB,
# included) would take most of CI's remaining budget. Run before a release; the README records the last run.
LOWEST_DEPS_VENV ?= .venv-lowest
LOWEST_DEPS_STAMP := $(LOWEST_DEPS_VENV)/.installed

$(LOWEST_DEPS_STAMP): pyproject.toml | $(VENV)/bin/uv
	$(PYTHON) -m venv $(LOWEST_DEPS_VENV)
	$(VENV)/bin/uv pip compile --quiet --python $(LOWEST_DEPS_VENV)/bin/python --resolution lowest-direct \
		--index-url https://pypi.org/simple pyproject.toml --extra dev -o $(LOWEST_DEPS_VENV)/lowest.txt
	$(VENV)/bin/uv pip install --quiet --python $(LOWEST_DEPS_VENV)/bin/python -r $(LOWEST_DEPS_VENV)/lowest.txt
	$(VENV)/bin/uv pip install --quiet --python $(LOWEST_DEPS_VENV)/bin/python --no-deps -e .
	touch $@

test-lowest: $(LOWEST_DEPS_STAMP)
	grep -E '^(torch|pandas|numpy|mlflow|kfp|apache-airflow|great-expectations|dvc)==' $(LOWEST_DEPS_VENV)/lowest.txt
	$(LOWEST_DEPS_VENV)/bin/python -m pytest -p no:cacheprovider -m "unit or contract" \
		--deselect tests/contract/test_images.py::test_images_agree_with_each_other_and_with_the_test_environment

# The training tests on the lowest torch the torch extra admits, in a virtualenv of their own. PyPI
# has only the CUDA build of torch 2.6 for Linux (2.9 GB with its NVIDIA libraries; pip's cache keeps
# it); it runs on the CPU here. Horovod is built against the dev venv's torch and TensorFlow brings no
# torch: their tests are deselected. The dev constraints hold except sympy, which torch 2.6 pins.
LOWEST_TORCH ?= 2.6.0
LOWEST_VENV  ?= .venv-lowest-torch
LOWEST_STAMP := $(LOWEST_VENV)/.installed-torch-$(LOWEST_TORCH)
LOWEST_TORCH_TESTS := tests/unit/test_loop.py tests/unit/test_checkpoint.py tests/unit/test_launch.py \
	tests/integration/test_training.py tests/integration/test_preemption.py

$(LOWEST_STAMP): pyproject.toml images/constraints.txt
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	grep -v '^sympy==' images/constraints.txt > $(LOWEST_VENV)/constraints.txt
	$(LOWEST_VENV)/bin/python -m pip install --quiet -e '.[torch,mlflow,report]' 'torch==$(LOWEST_TORCH)' 'pytest>=8' 'pytest-timeout>=2.3' \
		-c $(LOWEST_VENV)/constraints.txt
	touch $@

test-lowest-torch: $(LOWEST_STAMP)
	$(LOWEST_VENV)/bin/python -c "import torch; assert torch.__version__.startswith('$(LOWEST_TORCH)'), torch.__version__"
	$(LOWEST_VENV)/bin/python -m pytest -p no:cacheprovider $(LOWEST_TORCH_TESTS) -k "not horovod and not tensorflow"

# Each component README's settings, inputs, outputs and result tables, generated from its spec.py, and the lists
# that name every component, from the components' folders (components/*/metadata.yaml): README.md's table,
# pyproject's packages and package data, the images' lists in images/Dockerfile (`make lint` fails when one differs).
docs: $(STAMP)
	$(PY) scripts/settings_tables.py

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The CUDA tier, where a GPU is visible (make test skips it elsewhere; see ../shared/gpu/README.md for
# running it on a GPU machine that has torch but not trainpipe).
test-cuda: $(STAMP)
	$(PY) -m pytest tests/cuda -m cuda

# The loop for iterating (under 5 minutes on two cores): lint, then the unit and contract tiers, which hold the
# components' own tests and the docs' examples that only compile or load.
test-fast: lint
	$(PY) -m pytest -n $(TEST_WORKERS) -m "unit or contract"

compile: $(STAMP)
	$(VENV)/bin/trainpipe compile --profile cpu -o build/pipeline-cpu.yaml
	$(VENV)/bin/trainpipe compile --profile gpu -o build/pipeline-gpu.yaml

# The checked-in compiled pipelines and component specs the golden tests compare with.
# Regenerate after changing a face or the pipeline, and review the diff.
golden: $(STAMP)
	env -u TRAINPIPE_IMAGE $(VENV)/bin/trainpipe compile --profile cpu -o pipelines/golden/pipeline-cpu.yaml
	env -u TRAINPIPE_IMAGE $(VENV)/bin/trainpipe compile --profile gpu -o pipelines/golden/pipeline-gpu.yaml
	env -u TRAINPIPE_IMAGE $(PY) -c "from trainpipe.pipelines.compile import export_components; export_components('components', in_tree=True)"

# make component NAME=my_step: a new component folder with every role and its own passing tests; what names every
# component is found from the folders and regenerated (make docs: README.md's table, pyproject's packages, the
# images' lists, its README's settings table), and its component.yaml compiled (as make golden does).
component: $(STAMP)
	@test -n "$(NAME)" || { echo "usage: make component NAME=my_step" >&2; exit 2; }
	$(VENV)/bin/trainpipe scaffold $(NAME)
	$(PY) scripts/settings_tables.py
	env -u TRAINPIPE_IMAGE $(PY) -c "from trainpipe.pipelines.compile import export_components; export_components('components', in_tree=True, names=['$(NAME)'])"

# make training-function NAME=my_team: a team package with a training function on trainpipe's context
# (DIR=<where it goes>, default: the current folder) and a test that runs it through train_model
# (TESTS=<its folder>, default: tests/integration).
training-function: $(STAMP)
	@test -n "$(NAME)" || { echo "usage: make training-function NAME=my_team [DIR=path]" >&2; exit 2; }
	$(VENV)/bin/trainpipe scaffold-training $(NAME) --directory $(or $(DIR),.) --tests-dir $(or $(TESTS),tests/integration)

# Locked requirements per image (images/<kind>/requirements.lock), with hashes, from the pyproject
# extras each image needs; review the diff. One resolution of the dev extra (images/constraints.txt)
# constrains them all and the dev venv, so the images and the tests run the same versions. torch's CPU build comes from PyTorch's wheel page (or the
# copy on this disk).
TORCH_CPU_WHEELS ?= $(if $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl),/opt/wheels,https://download.pytorch.org/whl/torch/)
LOCK := $(VENV)/bin/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--generate-hashes --index-url https://pypi.org/simple --custom-compile-command "make lock" \
	-c images/constraints.txt -c images/torch.txt pyproject.toml images/build.in

$(VENV)/bin/uv: | $(VENV)/bin/python
	$(PIP) install --quiet uv==0.13.9

lock: | $(VENV)/bin/uv
	$(VENV)/bin/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-annotate \
		--index-url https://pypi.org/simple --custom-compile-command "make lock" pyproject.toml --extra dev -c images/torch.txt \
		--find-links $(TORCH_CPU_WHEELS) | grep -v '^torch==' > images/constraints.txt
	$(LOCK) --extra kfp --extra data --extra feast -o images/data/requirements.lock
	$(LOCK) images/horovod.in --extra kfp --extra data --extra feast --extra mlflow --extra torch --extra report --extra tensorflow --extra optimize --extra tune \
		--extra cluster --find-links $(TORCH_CPU_WHEELS) -o images/cpu/requirements.lock
	$(LOCK) images/horovod.in --extra kfp --extra mlflow --extra torch --extra report --extra cluster -o images/gpu/requirements.lock

# Build the images with podman: the cpu and data images here (the gpu image needs nvidia/cuda's devel image and
# torch's CUDA wheels from registries; elsewhere it is built too). The base is the Dockerfile's pinned
# python:3.11-slim-bookworm where a registry serves it, else a Debian bookworm base made once with debootstrap
# and cached under ~/.cache/trainpipe/images (scripts/build_images.sh). The Horovod wheel `make horovod` built is
# lent to the cpu image's build, which then need not compile it, when it was built with the cpu lock's torch.
# Each image's build time and size are printed; a rebuild with nothing changed takes its layers from podman's
# cache. The registry and the tags come from trainpipe.services.images, as the compiled pipelines and DAGs use them.
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_KINDS ?= data cpu gpu

images: $(STAMP) podman
	PYTHON=$(PY) HOROVOD_WHEELS=$(WHEELHOUSE) scripts/build_images.sh $(REVISION) $(IMAGE_KINDS)

push: images
	for kind in $(IMAGE_KINDS); do \
		CONTAINERS_CONF=$(CURDIR)/images/containers.conf podman push \
			$$($(PY) -c "from trainpipe.services.images import reference; print(reference('$$kind'))") || exit 1; \
	done

clean:
	rm -rf build .trainpipe .pytest_cache
