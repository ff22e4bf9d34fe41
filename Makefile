# Everything runs from a virtual environment cached outside the checkout, keyed on the hash of
# requirements.lock: the first run installs (torch is large), later runs start at once.
SHELL := /bin/bash
PYTHON ?= python3
WEIGHTCACHE_CACHE ?= $(HOME)/.cache/weightcache
export WEIGHTCACHE_CACHE
LOCK_HASH := $(shell sha256sum requirements.lock | cut -c1-16)
VENV := $(WEIGHTCACHE_CACHE)/venv-$(LOCK_HASH)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test env cluster unit integration e2e gpu bench bench-engine crds clean-venv

# No prerequisite on requirements.lock: its hash is in the path already, and a fresh clone's file
# times would otherwise make every checkout rebuild the cached environment.
$(VENV)/.complete:
	rm -rf $(VENV)
	mkdir -p $(WEIGHTCACHE_CACHE)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

# Re-pointing the editable install is cheap and keeps a shared venv on *this* checkout.
env: $(VENV)/.complete
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	ln -sfn $(VENV) .venv

demo: env
	$(VENV)/bin/weightcache demo

# The e2e control plane (etcd, kube-apiserver, controller-manager, scheduler from the upstream Go
# modules), built once per source hash into $(WEIGHTCACHE_CACHE)/cluster/<hash>/ (cold: ~9 min on 2 cores).
cluster:
	bash tests/cluster/build.sh

test: env cluster
	$(PY) -m pytest $(PYTEST_ARGS)

e2e: env cluster
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

unit: env
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: env
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

# On a machine with a CUDA GPU; elsewhere these tests are skipped.
gpu: env
	$(PY) -m pytest -m gpu tests/gpu $(PYTEST_ARGS)

bench: env
	$(VENV)/bin/weightcache bench --size-gib 4 --tensors 2000
	$(VENV)/bin/weightcache bench --size-gib 4 --tensors 20000

# crds/weightcache.yaml is generated from operator/weightcache_operator/spec.py; a unit test fails when they differ.
crds: env
	$(PY) -m weightcache_operator.crd --write

bench-engine: env
	$(PY) benchmarks/engine_restart.py --size-gib 3 --tp-size 2

clean-venv:
	rm -rf $(VENV) .venv
