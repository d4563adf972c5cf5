#!/usr/bin/env bash
# Build dev/bench/libllmc_kernels.so and run the per-kernel benchmark on the GPU
# machine, from the repository root. Installs the Liger-Kernel wheel from .whl/
# (no network there) into /tmp/site unless liger_kernel already imports.
# Every argument goes to bench_kernels.py, e.g.
#   dev/bench/run_kernels.sh --quick
#   dev/bench/run_kernels.sh --kernels rmsnorm,swiglu --tokens 8192,32768
# Results: dev/bench/results/kernels.jsonl (or --out PATH); with $OUT set (the device
# runner's output folder) they are also copied there.
set -euo pipefail
cd "$(dirname "$0")/../.."

NVCC="${NVCC:-nvcc}"
if ! command -v "$NVCC" > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
# Always rebuilt (seconds): a library carried from another machine may not match this CUDA.
lib=dev/bench/libllmc_kernels.so
echo "building $lib with $("$NVCC" --version | tail -1)"
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC,-fopenmp -shared -I. \
    dev/bench/kernels_capi.cu -o "$lib" -lcublasLt -lcublas

PYTHON="${PYTHON:-python3}"
site="${LIGER_SITE:-/tmp/site}"
if ! "$PYTHON" -c "import liger_kernel" 2> /dev/null; then
    whl=(.whl/liger_kernel-*.whl)
    if [ -f "${whl[0]}" ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --target "$site" "${whl[@]}"
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "warning: no liger_kernel wheel in .whl/; liger records will carry the import error" >&2
    fi
fi
# liger_kernel imports `packaging` without declaring it; --no-deps and no network leave it
# missing where torch did not bring it. pip's vendored copy is the same package.
if ! "$PYTHON" -c "import packaging.version" 2> /dev/null; then
    vendored=$("$PYTHON" -c "import pip._vendor.packaging as p; print(p.__path__[0])" 2> /dev/null || true)
    if [ -n "$vendored" ]; then
        mkdir -p "$site"
        rm -rf "$site/packaging"
        cp -r "$vendored" "$site/packaging"
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        echo "packaging: using pip's vendored copy ($vendored)"
    else
        echo "warning: no 'packaging' module; liger_kernel will not import" >&2
    fi
fi

out=dev/bench/results/kernels.jsonl
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    if [ "${args[$i]}" = "--out" ] && [ $((i + 1)) -lt ${#args[@]} ]; then out="${args[$((i + 1))]}"; fi
done
status=0
"$PYTHON" dev/bench/bench_kernels.py "$@" || status=$?
if [ -n "${OUT:-}" ] && [ -f "$out" ] && [ "$(cd "$(dirname "$out")" && pwd)" != "$(cd "$OUT" && pwd)" ]; then
    cp "$out" "$OUT/"
fi
exit $status
