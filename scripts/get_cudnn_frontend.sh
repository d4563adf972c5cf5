#!/usr/bin/env bash
# Fetch the cudnn-frontend C++ headers (header-only) from the nvidia-cudnn-frontend
# wheel on PyPI into third_party/cudnn-frontend/include. The version is pinned:
# 1.32.0 builds against cuDNN 9.14 (the GPU machine's system cuDNN) and 9.19.
set -euo pipefail
version=1.32.0
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/third_party/cudnn-frontend"
if [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ]; then
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$version" \
    || { echo "error: could not download nvidia-cudnn-frontend==$version from PyPI (is pip installed and PyPI reachable?)" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
(cd "$dest" && python3 -m zipfile -e "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/wheel" && mv "$tmp/wheel/include" include)
echo "$version" > "$dest/VERSION"
echo "cudnn-frontend $version headers in $dest/include"
