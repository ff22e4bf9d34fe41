# syntax=docker/dockerfile:1.7
# Four images from one file:
#   operator: the kopf control plane, small: weightcache_operator and weightcache_contract only, no torch
#             and no data plane (weightcache) package.
#   daemon:   torch + CUDA runtime, the weightcache package; runs daemons, the keeper and the reference engine.
#   vllm:     vLLM's official image plus the weightcache package; runs vllm-profile daemons, the keeper and
#             vLLM engines (spec.engine.vllm).
#   sglang:   SGLang's official image plus the weightcache package; runs sglang-profile daemons, the keeper
#             and SGLang engines (spec.engine.sglang).
# Base images are pinned by tag; pin by digest in your registry mirror for reproducible builds.

# The vllm target's base: vLLM's CUDA image by default; for CPU nodes pass a CPU build of vLLM
# (--build-arg VLLM_IMAGE=<an image of vLLM built for its cpu target>).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
# The sglang target's base: SGLang's CUDA image of a supported version
# (daemon_image/weightcache/sglang/versions.py).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.21-cu130

FROM python:3.11.11-slim-bookworm AS operator
LABEL org.opencontainers.image.title="weightcache-operator" \
      org.opencontainers.image.description="Kubernetes operator for weightcache" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /app
# The two packages are copied, not installed from pyproject.toml: that project is the whole of
# weightcache, torch included, and would bring the data plane's console script along.
RUN pip install --no-cache-dir "kopf>=1.37" "kubernetes>=29.0" "pydantic>=2.6" "pyyaml>=6.0" \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin weightcache
COPY contract/weightcache_contract/ weightcache_contract/
COPY operator/weightcache_operator/ weightcache_operator/
ENV PYTHONPATH=/app
USER 10001
ENTRYPOINT ["python", "-m", "weightcache_operator"]

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS daemon
LABEL org.opencontainers.image.title="weightcache-daemon" \
      org.opencontainers.image.description="weightcache daemon, keeper and reference engine" \
      org.opencontainers.image.licenses="Apache-2.0"
# The CUDA base tag pins the distribution release; Ubuntu's point versions of python3.12 rotate with
# security updates, so pinning them here would break the build rather than make it reproducible.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/weightcache
ENV VIRTUAL_ENV=/opt/weightcache PATH=/opt/weightcache/bin:$PATH
WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
RUN pip install --no-cache-dir -r requirements.lock
COPY contract/ contract/
COPY daemon_image/ daemon_image/
COPY operator/ operator/
RUN pip install --no-cache-dir --no-deps . \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin weightcache
USER 10001
ENTRYPOINT ["weightcache"]
CMD ["--help"]

FROM ${VLLM_IMAGE} AS vllm
LABEL org.opencontainers.image.title="weightcache-vllm" \
      org.opencontainers.image.description="vLLM with weightcache: vllm-profile daemons, the keeper, vLLM engines that map the cache" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY contract/ contract/
COPY daemon_image/ daemon_image/
COPY operator/ operator/
# vLLM's image holds torch, transformers and the rest at the versions vLLM was built against, so the
# project goes in without its dependencies (whose lock pins other versions): only those vLLM's image
# may lack are added, never torch. Installing the project registers its entry points: the weightcache
# command and the vLLM plug-in (vllm.general_plugins) that provides --load-format weightcache. The
# operator runs `python -m weightcache` in daemon pods; vLLM's image names its interpreter python3.
# The user gets a home: vLLM keeps its compile and usage caches under ~/.cache and ~/.config.
RUN python3 -m pip install --no-cache-dir "safetensors>=0.4.3" "pydantic>=2.6" "msgpack>=1.0" "numpy>=1.26" \
       "pyyaml>=6.0" "cuda-bindings>=12.6" \
    && python3 -m pip install --no-cache-dir --no-deps . \
    && if ! command -v python >/dev/null; then ln -s "$(command -v python3)" /usr/local/bin/python; fi \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin weightcache
USER 10001
ENTRYPOINT ["weightcache"]
CMD ["--help"]

FROM ${SGLANG_IMAGE} AS sglang
LABEL org.opencontainers.image.title="weightcache-sglang" \
      org.opencontainers.image.description="SGLang with weightcache: sglang-profile daemons, the keeper, SGLang engines that map the cache" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY contract/ contract/
COPY daemon_image/ daemon_image/
COPY operator/ operator/
# As for vllm: the project without its dependencies, so SGLang's pinned torch stays. Installing it
# registers the SGLang plug-in (sglang.srt.plugins) that provides --load-format weightcache.
RUN python3 -m pip install --no-cache-dir "safetensors>=0.4.3" "pydantic>=2.6" "msgpack>=1.0" "numpy>=1.26" \
       "pyyaml>=6.0" "cuda-bindings>=12.6" \
    && python3 -m pip install --no-cache-dir --no-deps . \
    && if ! command -v python >/dev/null; then ln -s "$(command -v python3)" /usr/local/bin/python; fi \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin weightcache
USER 10001
ENTRYPOINT ["weightcache"]
CMD ["--help"]
