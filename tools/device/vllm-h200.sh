#!/usr/bin/env bash
# vLLM 0.26 (CUDA) from the weight cache on the GPU machine: prepare here, carry, install, run there.
#
# The GPU machine has torch 2.11.0+cu130 and no network; vLLM 0.26.0 is the newest release built for
# that torch (docs/vllm.md). The wheel and the packages the machine lacks travel in parts
# (tools/device/carry.sh):
#
#   here:  bash tools/device/vllm-h200.sh prepare        # downloads, splits into .device/vllm/p<N>/
#   there: bash tools/device/vllm-h200.sh receive N      # once per part, carry [".device/vllm/pN"]
#   there: bash tools/device/vllm-h200.sh install        # joins, checks, installs into /tmp/vsite
#   there: bash tools/device/vllm-h200.sh bench SCENARIO [ARGS]  # benchmarks/vllm_gpu.py SCENARIO
#
# `prepare` prints the exact sequence of device calls.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/device/carry.sh

VLLM_WHEEL=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_MD5=8992ddad1e32deaafcc61107fa692d2a
PARTS=.device/vllm
SITE=/tmp/vsite
RECEIVED=/tmp/vllm-parts

# vLLM 0.26.0's requirements that the GPU machine's image lacks (docs/vllm.md says how they were
# found: `import vllm`, the offline engine and `vllm serve` in a scratch venv with PyPI's torch 2.11),
# plus weightcache's own (pydantic). Not carried, and not needed for a dense or block-FP8 model on
# Hopper: flashinfer (VLLM_USE_FLASHINFER_SAMPLER=0 below), tilelang, quack-kernels, cutlass-dsl,
# fastsafetensors, opentelemetry. huggingface_hub stays the image's (its transformers needs < 2).
DEPS=(
  annotated-types==0.8.0 anthropic==2.15.0 apache-tvm-ffi==0.1.15.post2 astor==0.8.1 blake3==1.0.11
  cachetools==8.0.2 cbor2==6.3.0 compressed-tensors==0.17.0 depyf==0.20.0 dill==0.4.1 distro==1.9.0
  docstring_parser==0.18.0 fastapi==0.136.3 httpcore2==2.16.2 httpx2==2.16.2 ijson==3.6.0 interegular==0.3.3
  jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 lark==1.2.2
  llguidance==1.7.6 lm-format-enforcer==0.11.3 loguru==0.7.3 mistral_common==1.13.1 model-hosting-container-standards==0.1.16
  msgspec==0.23.0 openai==3.57.0 openai-harmony==0.0.8 outlines_core==0.2.14 partial-json-parser==0.2.1.1.post7
  prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1 pycountry==26.2.16 pydantic==2.14.4
  pydantic-extra-types==2.11.1 pydantic_core==2.50.5 python-json-logger==4.2.0 python-multipart==0.0.34
  pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0
  truststore==0.10.5 typing-inspection==0.4.5 uvicorn==0.55.0 watchfiles==1.3.0 xgrammar==0.2.8
)

prepare() {
  local dl=.device/download
  exclude_device_dir
  mkdir -p "$dl/deps"
  [ -f "$dl/$VLLM_WHEEL" ] || python3 -m pip download -q --no-deps "${PLATFORMS[@]}" -d "$dl" vllm==0.26.0
  echo "$VLLM_MD5  $dl/$VLLM_WHEEL" | md5sum -c --quiet
  python3 -m pip download -q --no-deps "${PLATFORMS[@]}" -d "$dl/deps" "${DEPS[@]}"
  cp "$dl/$VLLM_WHEEL" "$dl/deps/"
  split_parts "$PARTS" tools/device/vllm-h200.sh "$dl"/deps/*.whl
  rm "$dl/deps/$VLLM_WHEEL"
  echo "  run  command: bash tools/device/vllm-h200.sh install && bash tools/device/vllm-h200.sh bench smoke"
}

install() {
  if [ -f "$SITE/.complete" ]; then echo "installed already"; return; fi
  join_checked "$RECEIVED"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$RECEIVED"/whole/*.whl
  entry_point "$SITE" vllm.general_plugins
  touch "$SITE/.complete"
  echo "installed into $SITE"
}

bench() {
  export PYTHONPATH="$PWD/contract:$PWD/daemon_image:$PWD/operator:$SITE"
  export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
  # exec: a `timeout` around this script signals the benchmark itself, which stops its engines.
  exec python3 benchmarks/vllm_gpu.py "$@"
}

device_main "$@"
