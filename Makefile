# Build and test. `make` builds what this machine can build; `make test` runs
# every CPU test (the README's test command); the GPU test needs a GPU.

CC ?= gcc
CFLAGS ?= -O3 -march=native
# The commit the programs are built from, for the first line of their logs (llmc/run/run_log.h).
GIT_COMMIT ?= $(shell git describe --always --dirty 2> /dev/null || echo unknown)
# override: what the build needs stays when the command line sets CFLAGS (make CFLAGS=-O0)
# -fno-math-errno: nothing reads errno after a math function, and with it sqrtf vectorises (the CPU AdamW, adamw_cpu.h)
override CFLAGS += -std=gnu11 -Wall -Wextra -fno-math-errno -I. -DGIT_COMMIT='"$(GIT_COMMIT)"'
LDLIBS = -lm
# OpenMP only parallelises the CPU reference's loops and the CPU AdamW; build without it if the compiler lacks it.
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
override CFLAGS += $(OPENMP)

FUZZ_SECONDS ?= 20

# Python: the project's virtual environment when scripts/setup.sh made one.
PYTHON ?= $(if $(wildcard .venv/bin/python3),.venv/bin/python3,python3)

LLMC_HEADERS = $(wildcard llmc/*/*.h)
CPU_TESTS = test_llama_ref tests/test_tensorfile tests/test_dataloader tests/test_launch tests/test_zero_plan \
            tests/test_master_weights tests/test_rendezvous tests/test_checkpoint_shards tests/test_watchdog \
            tests/test_documents tests/test_process_groups \
            tests/test_fp8 tests/test_adamw_cpu tests/test_nccl_sockets

# CUDA: Hopper (sm_90). cuDNN attention goes through the cudnn-frontend headers
# (scripts/get_cudnn_frontend.sh fetches them), compiled once into its own object.
NVCC ?= nvcc
HAVE_NVCC := $(shell command -v $(NVCC) 2> /dev/null)
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90
NVCC_FLAGS ?= -O3
override NVCC_FLAGS += -std=c++17 $(CUDA_ARCH) -DGIT_COMMIT='"$(GIT_COMMIT)"' -I. -isystem third_party/cudnn-frontend/include -Xcompiler -Wall,-fno-math-errno $(if $(OPENMP),-Xcompiler -fopenmp)
NVCC_LDLIBS = -lcublasLt -lcublas -lcudnn -lnvrtc -lnccl $(if $(OPENMP),-lgomp)
# MPI (optional): with it, ranks started by mpirun share NCCL's id through MPI;
# without it they use a rendezvous (llmc/parallel/rendezvous.h). Found through mpicc;
# only its -I, -L and -l flags are passed on, which nvcc understands.
MPICC ?= mpicc
USE_MPI ?= $(if $(shell command -v $(MPICC) 2> /dev/null),1,0)
ifeq ($(USE_MPI),1)
override NVCC_FLAGS += -DUSE_MPI $(filter -I%,$(shell $(MPICC) --showme:compile 2> /dev/null))
override NVCC_LDLIBS += $(filter -L% -l%,$(shell $(MPICC) --showme:link 2> /dev/null))
endif
CUDNN_FRONTEND = third_party/cudnn-frontend/include/cudnn_frontend.h
GPU_PROGRAMS = train_llama test_llama dev/bench/nccl_bench

.PHONY: all cpu gpu test test-c test-python test-cli test-checkpoint test-fuzz test-sanitize test-kill test-format format clean
all: cpu $(if $(HAVE_NVCC),gpu)
cpu: train_llama_ref $(CPU_TESTS) tests/hf_tool tests/fp8_tool
gpu: $(GPU_PROGRAMS)

$(CUDNN_FRONTEND):
	./scripts/get_cudnn_frontend.sh
build/attention_cudnn.o: llmc/kernels/attention_cudnn.cu llmc/kernels/attention.h llmc/common/cuda_common.h llmc/common/utils.h | $(CUDNN_FRONTEND)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@
train_llama: train_llama.cu build/attention_cudnn.o $(LLMC_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $< build/attention_cudnn.o -o $@ $(NVCC_LDLIBS)
# test_llama also checks FP8 against the CPU reference itself (tests/ref_capi.h), compiled by the C compiler
build/ref_capi.o: tests/ref_capi.c tests/ref_capi.h train_llama_ref.c $(LLMC_HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) -c $< -o $@
test_llama: test_llama.cu build/attention_cudnn.o build/ref_capi.o $(LLMC_HEADERS) tests/check.h tests/dump_check.h
	$(NVCC) $(NVCC_FLAGS) $< build/attention_cudnn.o build/ref_capi.o -o $@ $(NVCC_LDLIBS)

# NCCL's collectives over the trainer's process groups, for dev/bench/scaling_model.py
dev/bench/nccl_bench: dev/bench/nccl_bench.cu $(LLMC_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LDLIBS)

train_llama_ref: train_llama_ref.c $(LLMC_HEADERS)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)
test_llama_ref: test_llama_ref.c train_llama_ref.c $(LLMC_HEADERS) tests/check.h tests/dump_check.h
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)
tests/test_tensorfile: tests/dump_check.h
tests/test_watchdog: LDLIBS += -pthread
tests/hf_tool: tests/hf_tool.c $(LLMC_HEADERS)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)
tests/fp8_tool: tests/fp8_tool.c llmc/kernels/fp8.h
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)
tests/test_%: tests/test_%.c $(LLMC_HEADERS) tests/check.h tests/fake_env.h
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# Where nvcc exists the GPU programs are built too, so CUDA code that no longer
# compiles fails the tests even on a machine without a GPU.
test: test-format test-c test-python test-cli test-checkpoint test-kill test-fuzz test-sanitize
test-c: $(CPU_TESTS)
	./test_llama_ref
	./tests/test_tensorfile
	./tests/test_dataloader
	./tests/test_launch
	./tests/test_zero_plan
	./tests/test_master_weights
	./tests/test_rendezvous
	./tests/test_checkpoint_shards
	./tests/test_watchdog
	./tests/test_fp8
	./tests/test_documents
	./tests/test_process_groups
	./tests/test_adamw_cpu
	./tests/test_nccl_sockets
test-python: tests/hf_tool tests/fp8_tool train_llama_ref
	$(PYTHON) -m pytest -q tests
test-cli: train_llama_ref $(if $(HAVE_NVCC),gpu)
	bash tests/test_cli.sh
test-checkpoint: train_llama_ref
	PYTHON=$(PYTHON) bash tests/test_checkpoint.sh
# 50 SIGKILLs of a checkpointed CPU training run, each resumed: nothing lost, bit-identical to an uninterrupted run
test-kill: train_llama_ref
	$(PYTHON) tests/kill_loop.py --kills 50
# C, C++ and CUDA sources (tracked, and new ones git does not ignore) as .clang-format says, with Debian's clang-format 14 (whose output
# other versions do not reproduce exactly); `make format` rewrites them so
FORMAT_FILES = $(shell git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' 2> /dev/null || find . \( -path ./third_party -o -path ./.venv \
                 -o -path ./build -o -path ./.carry \) -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print)
test-format:
	@v=$$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
	if [ "$$v" != 14 ]; then echo "SKIP format: this is clang-format $$v; the check needs clang-format 14"; exit 0; fi; \
	clang-format --dry-run -Werror $(FORMAT_FILES) && echo "PASS format: $(words $(FORMAT_FILES)) files as .clang-format says"
format:
	clang-format -i $(FORMAT_FILES)
# libFuzzer with ASan and UBSan on every reader of outside files, FUZZ_SECONDS each
test-fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash tests/fuzz/run.sh
# The CPU tests and a short train, save and resume of the CPU trainer under
# AddressSanitizer (with its leak check) and UndefinedBehaviorSanitizer, built
# apart in build/sanitize/: any report fails the test
SANITIZE_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
SANITIZED = $(addprefix build/sanitize/,train_llama_ref $(CPU_TESTS))
build/sanitize/%: %.c train_llama_ref.c $(LLMC_HEADERS) tests/check.h tests/dump_check.h tests/fake_env.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SANITIZE_FLAGS) $< -o $@ $(LDLIBS) -pthread
test-sanitize: $(SANITIZED)
	SANITIZE_DIR=build/sanitize PYTHON=$(PYTHON) bash tests/test_sanitize.sh $(CPU_TESTS)

clean:
	rm -rf train_llama_ref $(CPU_TESTS) tests/hf_tool tests/fp8_tool $(GPU_PROGRAMS) build
