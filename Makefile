# infertune developer commands. `make setup` once on a fresh machine, then `make test`.
PYTHON ?= python3
APT_PACKAGES := prometheus numactl libjemalloc2

.PHONY: help setup setup-system setup-python e2e-build test test-unit test-e2e lint crds demo
.DEFAULT_GOAL := help

help: ## this list (a bare `make` installs nothing)
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "} {printf "  make %-12s %s\n", $$1, $$2}'

setup: setup-system setup-python e2e-build ## everything the tests need, from a bare machine

setup-system: ## Debian packages: the real Prometheus, numactl and jemalloc the tests use
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	missing=$$(for p in $(APT_PACKAGES); do \
	  [ "$$(dpkg-query -W -f='$${Status}' $$p 2>/dev/null)" = "install ok installed" ] || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	else echo "apt packages present: $(APT_PACKAGES)"; fi

setup-python: ## the package in editable mode with its test extras, at the versions of constraints.txt
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -c constraints.txt -e '.[test]'

e2e-build: ## the Kubernetes control plane from its Go modules (slow the first time, cached after)
	$(PYTHON) -m e2e.cluster build

test: e2e-build ## the whole suite: unit, integration and end-to-end
	$(PYTHON) -m pytest -p no:cacheprovider

test-unit: ## unit and integration tests only (a few minutes)
	$(PYTHON) -m pytest -p no:cacheprovider tests

test-e2e: e2e-build ## end-to-end tests against the real control plane
	$(PYTHON) -m pytest -p no:cacheprovider -m e2e e2e

lint: ## ruff and mypy --strict
	$(PYTHON) -m ruff check operator tests e2e bench
	$(PYTHON) -m mypy operator

crds: ## regenerate crds/ from the models
	$(PYTHON) -m infertune crds -o crds/infertune.io_inferencetunings.yaml
	$(PYTHON) -m infertune crds -o charts/infertune/crds/infertune.io_inferencetunings.yaml

demo: ## the main job on the embedded examples
	$(PYTHON) -m infertune validate examples/*.yaml
	$(PYTHON) -m infertune crds
	$(PYTHON) -m infertune plan examples/vllm-qwen2-7b-h200-mig.yaml --pod examples/vllm-qwen2-7b-h200-mig.yaml
