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

# patch_once FILE MARKER WHAT: unless MARKER is in FILE already, applies the edits that the Python on stdin lists
# (edits = [(old, new), ...], each old found exactly once), or stops saying that FILE no longer has WHAT
patch_once() {
    grep -q "$2" "$1" && return 0
    python3 -c '
import sys
path, what = sys.argv[1], sys.argv[2]
env = {}
exec(sys.stdin.read(), env)
s = open(path).read()
for old, new in env["edits"]:
    if s.count(old) != 1:
        sys.exit(f"build_llmq.sh: {path} no longer has {what}")
    s = s.replace(old, new)
open(path, "w").write(s)
' "$1" "$3" || exit 1
}

# llmq's worker threads store an exception and the main thread's rethrow ends in std::terminate without its text
# (issue 30: "Thread 0 exited with uncaught exception"); print what() where the worker catches it, or the type's
# name where it is no std::exception. The text goes to stderr, above the step output a log of both shows.
patch_once "$SRC/src/utilities/comm.cpp" "uncaught exception of type %s" "the catch the exception print goes into" << 'PY'
store = "                std::lock_guard<std::mutex> lock(bar->Mutex);\n                bar->Exceptions[i] = std::current_exception();\n"
old = "            } catch(...) {\n" + store
what = ("            } catch(const std::exception& e) {\n"
        "                fprintf(stderr, \"Thread %d: uncaught exception: %s\\n\", i, e.what());\n"
        "                fflush(stderr);\n" + store)
other = ("            } catch(...) {\n"
         "                std::type_info *type = abi::__cxa_current_exception_type();\n"
         "                fprintf(stderr, \"Thread %d: uncaught exception of type %s\\n\", i, type ? type->name() : \"?\");\n"
         "                fflush(stderr);\n" + store)
edits = [(old, what + other),
         ("#include <stdexcept>\n", "#include <stdexcept>\n#include <cxxabi.h>\n#include <typeinfo>\n")]
PY

# The gradient norm launches a grid of ceil(count / 512) blocks for every gradient tensor, and a model without
# q, k, v biases (Llama) has empty bias tensors: a grid of 0 blocks, cudaErrorInvalidValue at global_norm.cu:120
# (issue 30; found by the exception print above). An empty tensor adds nothing to the norm, so it returns first.
patch_once "$SRC/src/kernels/global_norm.cu" "empty tensor adds nothing" "the launch the empty-tensor return goes before" \
    << 'PY'
old = "    const int block_size = 512;\n    const int max_grid_size = get_max_num_block_sums(dp);\n"
edits = [(old, "    if (count == 0) return; // an empty tensor adds nothing to the norm\n" + old)]
PY

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
