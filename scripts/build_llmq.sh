#!/usr/bin/env bash
# Build llmq (github.com/IST-DASLab/llmq) offline for sm_90 into .carry/llmq/, for the
# benchmark tables of issue 30. The GPU machine has no network, so the build happens
# here and the binaries travel in .carry/ (ignored). CMake's FetchContent downloads are
# replaced by local source trees (git archives of the upstream tags, taken from bare
# mirrors): set the *_GIT variables to bare git directories, or *_SRC to unpacked trees.
#
#   LLMQ_GIT=/path/llmq.git [LLMQ_REF=fp8-opt-bugfix] \
#   JSON_GIT=... CUDNN_FE_GIT=... CLI11_GIT=... FMT_GIT=... CATCH2_GIT=... scripts/build_llmq.sh
#
# Options used: USE_MPI=OFF (multi-GPU runs use llmq's threads backend, --gpus=N),
# USE_NVML=OFF (no nvml.h here; only its GPU-stats report is lost), cuFile absent (its
# fallback), BUILD_TESTS=OFF, CMAKE_CUDA_ARCHITECTURES=90. RPATH: $ORIGIN/../lib and
# /usr/local/cuda/lib64 (cudart, cublasLt, cudnn, nccl come from the system there).
# llmq asks for CUDA 20, which Debian's CMake 3.25 cannot give nvcc: CMAKE=/path/to/cmake names a newer one
# (the cmake wheel's, 3.31, works).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SRC=${LLMQ_SRC:-$ROOT/.carry/llmq-src}
DEPS=$ROOT/.carry/llmq-deps
BUILD=$ROOT/build/llmq
PREFIX=$ROOT/.carry/llmq
JOBS=${JOBS:-$(nproc)}

unpack() { # bare-git-dir ref dest
    [ -d "$3" ] && [ -n "$(ls -A "$3" 2> /dev/null)" ] && return 0
    [ -n "$1" ] || { echo "error: $3 missing and no git dir given" >&2; exit 1; }
    mkdir -p "$3"
    git --git-dir="$1" archive "$2" | tar -x -C "$3"
}
unpack "${LLMQ_GIT:-}" "${LLMQ_REF:-fp8-opt-bugfix}" "$SRC"
# upstream pins json v3.12.0 (release tarball); the mirror here ends at v3.11.3, which has the same API
unpack "${JSON_GIT:-}" "${JSON_REF:-v3.11.3}" "${JSON_SRC:-$DEPS/json}"
unpack "${CUDNN_FE_GIT:-}" "${CUDNN_FE_REF:-v1.12.0}" "${CUDNN_FE_SRC:-$DEPS/cudnn-frontend}"
unpack "${CLI11_GIT:-}" "${CLI11_REF:-v2.6.1}" "${CLI11_SRC:-$DEPS/cli11}"
unpack "${FMT_GIT:-}" "${FMT_REF:-12.0.0}" "${FMT_SRC:-$DEPS/fmt}"
unpack "${CATCH2_GIT:-}" "${CATCH2_REF:-v3.6.0}" "${CATCH2_SRC:-$DEPS/catch2}"

# llmq's worker threads store an exception and the main thread's rethrow ends in std::terminate without its text
# (issue 30: "Thread 0 exited with uncaught exception"); print what() where the worker catches it, and the type's
# name where it is no std::exception (the Qwen FP8 and 1B failures are of that kind)
comm=$SRC/src/utilities/comm.cpp
if ! grep -q "uncaught exception of type %s" "$comm"; then
    python3 - "$comm" << 'PY'
import sys
p = sys.argv[1]
s = open(p).read()
store = "                std::lock_guard<std::mutex> lock(bar->Mutex);\n                bar->Exceptions[i] = std::current_exception();\n"
old = "            } catch(...) {\n" + store
what = ("            } catch(const std::exception& e) {\n"
        "                fprintf(stderr, \"Thread %d: uncaught exception: %s\\n\", i, e.what());\n"
        "                fflush(stderr);\n" + store)
other = ("            } catch(...) {\n"
         "                std::type_info *type = abi::__cxa_current_exception_type();\n"
         "                fprintf(stderr, \"Thread %d: uncaught exception of type %s\\n\", i, type ? type->name() : \"?\");\n"
         "                fflush(stderr);\n" + store)
if s.count(old) != 1:
    sys.exit(f"build_llmq.sh: {p} no longer has the catch the exception print goes into")
s = s.replace(what, "")  # an earlier version of this patch
s = s.replace(old, what + other)
s = s.replace("#include <stdexcept>\n", "#include <stdexcept>\n#include <cxxabi.h>\n#include <typeinfo>\n", 1)
open(p, "w").write(s)
PY
fi

# The gradient norm launches a grid of ceil(count / 512) blocks for every gradient tensor, and a model without
# q, k, v biases (Llama) has empty bias tensors: a grid of 0 blocks, cudaErrorInvalidValue at global_norm.cu:120
# (issue 30; found by the exception print above). An empty tensor adds nothing to the norm, so it returns first.
norm=$SRC/src/kernels/global_norm.cu
if ! grep -q "empty tensor adds nothing" "$norm"; then
    python3 - "$norm" << 'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = "    const int block_size = 512;\n    const int max_grid_size = get_max_num_block_sums(dp);\n"
if s.count(old) != 1:
    sys.exit(f"build_llmq.sh: {p} no longer has the launch the empty-tensor return goes before")
s = s.replace(old, "    if (count == 0) return; // an empty tensor adds nothing to the norm\n" + old)
open(p, "w").write(s)
PY
fi

export PATH=/usr/local/cuda/bin:$PATH
${CMAKE:-cmake} -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    -DUSE_MPI=OFF -DUSE_NVML=OFF -DUSE_CUFILE=OFF -DBUILD_TESTS=OFF -DPYTHON_BINDING=OFF \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_JSON="${JSON_SRC:-$DEPS/json}" \
    -DFETCHCONTENT_SOURCE_DIR_CUDNN-FE="${CUDNN_FE_SRC:-$DEPS/cudnn-frontend}" \
    -DFETCHCONTENT_SOURCE_DIR_CLI11="${CLI11_SRC:-$DEPS/cli11}" \
    -DFETCHCONTENT_SOURCE_DIR_FMT="${FMT_SRC:-$DEPS/fmt}" \
    -DFETCHCONTENT_SOURCE_DIR_CATCH2="${CATCH2_SRC:-$DEPS/catch2}" \
    -DNCCL_INCLUDE_DIR=/usr/local/cuda/include -DNCCL_LIB_DIR=/usr/local/cuda/lib64 \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN;/usr/local/cuda/lib64'
${CMAKE:-cmake} --build "$BUILD" --parallel "$JOBS" --target train export-checkpoint
${CMAKE:-cmake} --install "$BUILD"
# the commit built, where the git directory is given (a rebuild of the unpacked tree keeps the file it has)
if [ -n "${LLMQ_GIT:-}" ]; then
    git --git-dir="$LLMQ_GIT" rev-parse "${LLMQ_REF:-fp8-opt-bugfix}" > "$PREFIX/LLMQ_COMMIT"
fi
ls -la "$PREFIX/bin" "$PREFIX/lib"
