#!/usr/bin/env bash
# SGLang 0.5.17 (CUDA) from the weight cache on the GPU machine: prepare here, carry, install, run there.
#
# SGLang 0.5.17 is the newest release for the GPU machine's torch 2.11.0+cu130 (docs/sglang.md). The
# machine has no network, so its wheel, its kernel package and what a start on Hopper imports travel
# as parts (tools/device/carry.sh):
#
#   here:  bash tools/device/sglang-h200.sh prepare        # downloads, trims, splits into .device/sglang/p<N>/
#   there: bash tools/device/sglang-h200.sh receive N      # once per part, carry [".device/sglang/pN"]
#   there: bash tools/device/sglang-h200.sh install        # joins, checks, installs into /tmp/ssite
#   there: bash tools/device/sglang-h200.sh bench SCENARIO [ARGS]  # benchmarks/sglang_gpu.py SCENARIO
#
# What travels is the minimal set, found as docs/sglang.md ("On a GPU") says:
# - sglang-kernel without FlashAttention 3 (`flash_ops`, 1.1 GB of its 1.2 GB unpacked) and without
#   its Blackwell build (`sm100/`): SGLang imports FA3 only in its `fa3` attention backend, and every
#   start here names `--attention-backend triton`.
# - flashinfer, whose sampling module SGLang imports on every CUDA start (`layers/sampler.py`);
#   `--sampling-backend pytorch` keeps its JIT kernels from being built. It needs nvidia-ml-py.
# - The distributions a start imports (`import` traced in the CPU test venv of the same SGLang),
#   installed only where the image lacks them; SGLang's pins that the image's versions break are
#   installed whatever the image has (FORCED: transformers 5.17 fails in SGLang 0.5.17 with
#   "'qwen3_asr' is already used"). SGLang's server imports soundfile, which needs cffi: the image
#   has neither.
# Not carried: sgl-deep-gemm (without it SGLang's block-FP8 GEMMs use its Triton and CUTLASS
# kernels, and no UE8M0 requantisation), FA3, tilelang, quack-kernels, cutlass-dsl, torchao.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/device/carry.sh

SGLANG=sglang==0.5.17
KERNEL=sglang-kernel==0.4.5
KERNEL_SHA256=5927a14dfff92ced8b1f7c7d5844144bc574ec58e604d4fd53e6f53c709003a8
PARTS=.device/sglang
SITE=/tmp/ssite
RECEIVED=/tmp/sglang-parts
FORCED=(sglang transformers tokenizers flashinfer_python pydantic pydantic_core)

DEPS=(
  flashinfer_python==0.6.15.post1 nvidia-ml-py==13.615.71 transformers==5.12.1 tokenizers==0.22.2
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0
  anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 click==8.5.1 compressed-tensors==0.17.0
  dill==0.4.1 dnspython==2.9.2 email-validator==2.4.0 fastapi==0.136.3 frozenlist==1.8.0 gguf==0.19.0
  h11==0.16.0 httpcore==1.0.9 httpx==0.29.0 httpx2==2.17.0 ipython==9.19.1 jmespath==1.1.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 loguru==0.7.3 markdown-it-py==4.3.0 mdurl==0.1.2
  mistral_common==1.13.1 msgspec==0.23.0 multidict==7.2.1 openai==3.57.0 orjson==3.13.0
  partial-json-parser==0.2.1.1.post7 propcache==0.5.4 pybase64==1.5.1 pycountry==26.2.16 pydantic==2.14.4
  pydantic-extra-types==2.11.1 pydantic_core==2.50.5 Pygments==2.21.0 python-multipart==0.0.34
  pyzmq==27.3.0 referencing==0.37.0 rich==15.0.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1
  soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 starlette==1.10.0 traitlets==5.16.1 typing-inspection==0.4.5 uvicorn==0.55.0
  uvloop==0.23.0 watchfiles==1.3.0 xgrammar==0.2.8 yarl==1.25.1
)

prepare() {
  local dl=.device/download/sglang stage=.device/download/sglang/stage
  exclude_device_dir
  mkdir -p "$dl" && rm -rf "$stage" && mkdir -p "$stage"
  python3 -m pip download -q --no-deps "${PLATFORMS[@]}" -d "$dl" "$SGLANG" "$KERNEL" "${DEPS[@]}"
  local kernel
  kernel=$(ls "$dl"/sglang_kernel-*.whl)
  echo "$KERNEL_SHA256  $kernel" | sha256sum -c --quiet
  rm -rf "$dl/kernel" && mkdir -p "$dl/kernel"
  unzip -q "$kernel" -d "$dl/kernel" -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*'
  tar -C "$dl/kernel" -czf "$stage/sgl_kernel.tgz" .
  cp "$dl"/*.whl "$stage/" && rm "$stage"/sglang_kernel-*.whl
  split_parts "$PARTS" tools/device/sglang-h200.sh "$stage"/*
  echo "  run  command: bash tools/device/sglang-h200.sh install && bash tools/device/sglang-h200.sh bench smoke"
}

install() {
  if [ -f "$SITE/.complete" ]; then echo "installed already"; return; fi
  join_checked "$RECEIVED"
  mkdir -p "$SITE"
  tar -C "$SITE" -xzf "$RECEIVED/whole/sgl_kernel.tgz"
  # A wheel goes in where the image lacks its distribution, or where SGLang needs its own version.
  local wheels=() have=() whl dist
  for whl in "$RECEIVED"/whole/*.whl; do
    dist=$(basename "$whl" | cut -d- -f1)
    if [[ " ${FORCED[*]} " == *" $dist "* ]] || ! python3 -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
      wheels+=("$whl")
    else
      have+=("$dist")
    fi
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}"
  echo "the image's own: ${have[*]}"
  echo "installed: $(for w in "${wheels[@]}"; do basename "$w" | cut -d- -f1-2; done | tr '\n' ' ')"
  entry_point "$SITE" sglang.srt.plugins
  touch "$SITE/.complete"
  echo "installed into $SITE"
}

bench() {
  export PYTHONPATH="$PWD/contract:$PWD/daemon_image:$PWD/operator:$SITE"
  export PYTHONUNBUFFERED=1
  # exec: a `timeout` around this script signals the benchmark itself, which stops its engines.
  exec python3 benchmarks/sglang_gpu.py "$@"
}

device_main "$@"
