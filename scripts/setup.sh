#!/usr/bin/env bash
# Install what building, testing and data preparation need on a fresh Debian
# or Ubuntu machine: the Debian packages below and a Python virtual environment
# in .venv with the Python packages below. Safe to run again.
#   Debian: build-essential (gcc, make), python3, python3-venv, python3-pip,
#           bible-kjv and fortunes (the default corpus), unzip, clang and
#           libclang-rt-14-dev (libFuzzer and the sanitizers of make test-fuzz),
#           clang-format (the style check of make test)
#   Python: numpy, pytest, matplotlib (benchmark plots), tiktoken,
#           zstandard and pyarrow (data/prepare.py's .zst and parquet inputs),
#           isal (its .gz inputs read faster than through gzip),
#           tokenizers (an HF model directory's tokenizer.json: --tokenizer hf),
#           llama-models (only for its Llama 3 tokenizer file) and
#           openai-whisper (only for its GPT-2 BPE file), both installed
#           without their dependencies
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
debian_packages="build-essential python3 python3-venv python3-pip bible-kjv fortunes unzip clang libclang-rt-14-dev clang-format"
missing=""
for p in $debian_packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "installing Debian packages:$missing"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing > /dev/null
fi

if [ ! -x .venv/bin/python3 ]; then
    python3 -m venv .venv
fi
.venv/bin/python3 -m pip install -q --upgrade pip > /dev/null
.venv/bin/python3 -m pip install -q numpy pytest matplotlib tiktoken safetensors ml_dtypes zstandard pyarrow isal \
    tokenizers
.venv/bin/python3 -m pip install -q --no-deps llama-models openai-whisper
echo "setup done: Debian packages and .venv ready"
