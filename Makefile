# ninfer: one cuda translation unit, cudart linked statically.
#
#   make                  build build/apps/ninfer (+ the ninfer-serve and ninfer-bench links), fat binary
#   make bench            ninfer-bench's standard set (BENCH_MODEL=path, default models/kjv/kjv.ninfer)
#   make GPU_ARCH=90      one sm target only: fast iteration on an h100/h200
#   make test             install what the tests need, build and run every test (ci runs this)
#   make check-build      compile only (what ci can do without a gpu)
#   make debug            host asan + device -G -lineinfo
#   make clean

NVCC     ?= nvcc
PYTHON   ?= python3
BUILD    := build
# sass for ampere .. blackwell plus ptx for what comes next
ALL_ARCH := 80 86 89 90 120
GPU_ARCH ?= $(ALL_ARCH)
# sm_90 is built as sm_90a: the prefill gemm's wgmma path (hopper only; other archs, and a
# binary without 90a code, take the mma.sync kernel)
sm       = $(if $(filter 90,$(1)),90a,$(1))
GENCODE  := $(foreach a,$(GPU_ARCH),-gencode arch=compute_$(call sm,$(a)),code=sm_$(call sm,$(a))) \
            -gencode arch=compute_$(lastword $(GPU_ARCH)),code=compute_$(lastword $(GPU_ARCH))
# tests use one target: they compile the whole translation unit and run on the h200 (sm_90a)
TEST_ARCH ?= 90
TEST_GENCODE := -gencode arch=compute_$(call sm,$(TEST_ARCH)),code=sm_$(call sm,$(TEST_ARCH))

CXXSTD   := -std=c++17
HOSTFLAGS:= -O3 -fopenmp -Wall -Wno-unused-function
NVFLAGS  := $(CXXSTD) -O3 -lineinfo -cudart static -Xcompiler "$(HOSTFLAGS)" --expt-relaxed-constexpr
LDLIBS   := -lgomp -lpthread -ldl -lrt
GTEST    := -lgtest_main -lgtest -lpthread

HEADERS  := format.h $(wildcard tokenizer.h serve.h vision.h unicode_tables.h grammar.h)
TEST_HEADERS := test/test_util.h test/dev_kernels.cuh

$(info ninfer: GPU_ARCH=$(GPU_ARCH) (make GPU_ARCH=90 for a single target))

.PHONY: all test check-build debug clean deps demo models bench
all: $(BUILD)/apps/ninfer $(BUILD)/apps/ninfer-serve $(BUILD)/apps/ninfer-bench

$(BUILD)/apps/ninfer: ninfer.cu $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(GENCODE) -o $@ ninfer.cu $(LDLIBS)

# the server and the bench are the same binary; argv[0] picks the mode
$(BUILD)/apps/ninfer-serve: $(BUILD)/apps/ninfer
	ln -sf ninfer $@
$(BUILD)/apps/ninfer-bench: $(BUILD)/apps/ninfer
	ln -sf ninfer $@

# the standard set: prompt and generation at depth 0 and 4096, generation at 32768 (on the gpu;
# the cpu path runs it too, slowly: give BENCH_ARGS for a smaller set). rows on stdout.
BENCH_MODEL ?= models/kjv/kjv.ninfer
BENCH_ARGS  ?= -p 512,4096 -n 128 -pg 4096,128 -d 0,4096 -r 5
BENCH_LONG  ?= -p 0 -n 128 -d 32768 -r 3
bench: $(BUILD)/apps/ninfer-bench
	$(BUILD)/apps/ninfer-bench $(BENCH_MODEL) $(BENCH_ARGS)
	$(BUILD)/apps/ninfer-bench $(BENCH_MODEL) $(BENCH_LONG)

check-build: $(BUILD)/apps/ninfer

# the quick start: a 10M-parameter qwen3.5 trained on the king james bible (models/kjv),
# text completion from a fixed prompt, on the gpu or, without one, the cpu
demo: $(BUILD)/apps/ninfer
	$(BUILD)/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said" --temperature 0.7 --seed 2 \
	    --presence-penalty 0 --max-new 80

debug:
	@mkdir -p $(BUILD)/debug
	$(NVCC) $(CXXSTD) -G -g -lineinfo -Xcompiler "-O0 -g -fopenmp -fsanitize=address" $(TEST_GENCODE) \
	    -o $(BUILD)/debug/ninfer ninfer.cu $(LDLIBS) -lasan

# ---- tests -------------------------------------------------------------------
# test binaries include ninfer.cu under NINFER_TESTING (or a header module) and run from the
# repo root. synthetic models are made by convert.py (deterministic: same seed, same bytes).

MODELS := $(BUILD)/models
SYNTH  := tiny tiny-gqa1 tiny-gqa3
TEST_MODELS := $(foreach n,$(SYNTH),$(MODELS)/$(n).ninfer $(MODELS)/$(n)-bf16.ninfer)

$(MODELS)/%-hf/config.json: convert.py
	@mkdir -p $(MODELS)
	$(PYTHON) convert.py --synthetic $* -o $(MODELS)/$*-hf
$(MODELS)/%-bf16.ninfer: $(MODELS)/%-hf/config.json convert.py
	$(PYTHON) convert.py $(MODELS)/$*-hf -o $@ --weights bf16
$(MODELS)/%.ninfer: $(MODELS)/%-hf/config.json convert.py
	$(PYTHON) convert.py $(MODELS)/$*-hf -o $@ --weights groupwise-int
.PRECIOUS: $(MODELS)/%-hf/config.json

models: $(TEST_MODELS)

# the cli under test: one sm target, so ci compiles it quickly
$(BUILD)/test/ninfer: ninfer.cu $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ ninfer.cu $(LDLIBS)

$(BUILD)/test/test_format: test/test_format.cu ninfer.cu $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/test_format.cu $(LDLIBS) $(GTEST)

# the cpu reference path: against itself, and against the hf goldens in test/golden
# (test/reference/make_goldens.py); golden tests skip while their files are missing
$(BUILD)/test/test_cpu: test/test_cpu.cu ninfer.cu $(HEADERS) $(TEST_HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/test_cpu.cu $(LDLIBS) $(GTEST)

# mtp speculative decoding on the cpu reference path: lossless greedy, forced drafts, stops inside
# a round, speculative sampling's distribution, kjv acceptance
$(BUILD)/test/test_spec: test/test_spec.cu ninfer.cu $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/test_spec.cu $(LDLIBS) $(GTEST)

# the vision tower and the multimodal prompt on the cpu path against the hf goldens
# (test/reference/make_vision_goldens.py)
$(BUILD)/test/test_tower: test/test_tower.cu ninfer.cu $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/test_tower.cu $(LDLIBS) $(GTEST)

# the gpu kernels against their cpu twins; builds without a gpu, skips at run time without one.
# benches: build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench*'
$(BUILD)/test/test_kernels: test/test_kernels.cu ninfer.cu $(HEADERS) $(TEST_HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/test_kernels.cu $(LDLIBS) $(GTEST)

TEST_BINS := $(BUILD)/test/test_format $(BUILD)/test/test_cpu $(BUILD)/test/test_tower $(BUILD)/test/test_kernels $(BUILD)/test/test_spec

# the whole-model gpu forward against the cpu reference (skips without a gpu), and where a
# decode step's time goes (build/test/bench_gpu MODEL; speeds are ninfer-bench's)
$(BUILD)/test/test_gpu: test/test_gpu.cu ninfer.cu $(HEADERS) $(TEST_HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/test_gpu.cu $(LDLIBS) $(GTEST)
$(BUILD)/test/bench_gpu: test/bench_gpu.cu ninfer.cu $(HEADERS) $(TEST_HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/bench_gpu.cu $(LDLIBS)
TEST_BINS += $(BUILD)/test/test_gpu
test: $(BUILD)/test/bench_gpu
# what an mtp round would cost on the gpu, from its pieces: build/test/bench_spec MODEL [--draft-tokens K]
$(BUILD)/test/bench_spec: test/bench_spec.cu ninfer.cu $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(TEST_GENCODE) -o $@ test/bench_spec.cu $(LDLIBS)
test: $(BUILD)/test/bench_spec

# openmp threads sleep at barriers instead of spinning: test machines are shared, and a thread
# spinning for a descheduled teammate costs far more than a wake-up (the cpu tests run 3x faster)
export OMP_WAIT_POLICY ?= passive

# the tokenizer, chat template and output parser (tokenizer.h): host code only, checked
# against hf tokenizers / transformers goldens in test/golden (test/gen_*_goldens.py)
$(BUILD)/test/test_tokenizer: test/test_tokenizer.cc tokenizer.h unicode_tables.h format.h Makefile
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -Wall -Wno-unused-function -I. -o $@ test/test_tokenizer.cc $(GTEST)
TEST_BINS += $(BUILD)/test/test_tokenizer

# constrained decoding (grammar.h): the schema compiler, the gbnf parser and the matcher against
# their oracles (test_grammar); grammar_gen walks the schema corpus for test/test_structured.py
# (jsonschema validates) and benches the mask: build/test/grammar_gen bench TOKENIZER ROWS SCHEMA DOC
$(BUILD)/test/test_grammar: test/test_grammar.cc grammar.h tokenizer.h unicode_tables.h format.h Makefile
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -Wall -Wno-unused-function -I. -o $@ test/test_grammar.cc $(GTEST)
$(BUILD)/test/grammar_gen: test/grammar_gen.cc grammar.h tokenizer.h unicode_tables.h format.h Makefile
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -Wall -Wno-unused-function -I. -o $@ test/grammar_gen.cc
TEST_BINS += $(BUILD)/test/test_grammar
test: $(BUILD)/test/grammar_gen

# media decoding and preprocessing (vision.h): host code only, against PIL and hugging face's
# processors on the committed corpus test/media (test/gen_media_corpus.py made it and its goldens)
VISION_CXXFLAGS := -std=c++17 -O2 -Wall -Wno-unused-function -I.
$(BUILD)/test/test_vision: test/test_vision.cc vision.h format.h Makefile
	@mkdir -p $(@D)
	$(CXX) $(VISION_CXXFLAGS) -pthread -o $@ test/test_vision.cc $(GTEST)
TEST_BINS += $(BUILD)/test/test_vision

# the decoders under asan + ubsan on mutations of the corpus's png and jpeg files (a few
# seconds: FUZZ_ITERS mutations per file; FUZZ_ITERS=100000 for a long run)
FUZZ_ITERS ?= 400
$(BUILD)/test/fuzz_vision: test/fuzz_vision.cc vision.h format.h Makefile
	@mkdir -p $(@D)
	$(CXX) $(VISION_CXXFLAGS) -pthread -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -o $@ test/fuzz_vision.cc
.PHONY: fuzz-vision
fuzz-vision: $(BUILD)/test/fuzz_vision
	$(BUILD)/test/fuzz_vision $(FUZZ_ITERS) test/media/png_*.png test/media/pil_*.png test/media/jpg_*.jpg

# the http server (serve.h): host code only, no gpu. serve_fake is ninfer-serve with a
# deterministic fake engine (test/test_serve.py drives it with the openai and anthropic sdks);
# test_serve covers the pure parts (http parsing, chunked bodies, utf-8 holdback, flags).
# make test-serve runs just these. build/test/ninfer-serve is the real server for
# NINFER_SERVE_CMD="build/test/ninfer-serve build/models/tiny.ninfer" pytest test/test_serve.py
# and for test/test_serve_robust.py (memory budget, isolation, cancel, the hostile battery:
# with models/kjv on the cpu path; its real-engine tests skip while it is not built), and for
# test/test_serve_api.py (responses, completions, logprobs: the fake, and the real server on
# models/kjv, its logprobs against --logits-out)
SERVE_CXXFLAGS := -std=c++17 -O2 -Wall -Wno-unused-function -pthread
$(BUILD)/test/serve_fake: test/serve_fake.cc serve.h format.h grammar.h Makefile
	@mkdir -p $(@D)
	$(CXX) $(SERVE_CXXFLAGS) -o $@ test/serve_fake.cc
$(BUILD)/test/test_serve: test/test_serve.cc serve.h format.h grammar.h Makefile
	@mkdir -p $(@D)
	$(CXX) $(SERVE_CXXFLAGS) -o $@ test/test_serve.cc $(GTEST)
$(BUILD)/test/ninfer-serve: $(BUILD)/test/ninfer
	ln -sf ninfer $@
# ninfer-bench's flags, formats and errors on the cpu path: test/test_bench_cli.py
$(BUILD)/test/ninfer-bench: $(BUILD)/test/ninfer
	ln -sf ninfer $@
TEST_BINS += $(BUILD)/test/test_serve
test: $(BUILD)/test/serve_fake
.PHONY: test-serve
test-serve: deps $(BUILD)/test/serve_fake $(BUILD)/test/test_serve
	$(BUILD)/test/test_serve
	$(PYTHON) -m pytest -q test/test_serve.py test/test_serve_robust.py test/test_serve_api.py

# what the tests need: python packages pinned in test/requirements.txt (installed when missing)
deps:
	@$(PYTHON) test/check_deps.py || $(PYTHON) -m pip install -q -r test/requirements.txt

$(BUILD)/test/format_vectors.ninfer: test/make_format_vectors.py convert.py
	@mkdir -p $(@D)
	$(PYTHON) test/make_format_vectors.py $@

test: deps fuzz-vision $(BUILD)/test/ninfer $(BUILD)/test/ninfer-serve $(BUILD)/test/ninfer-bench $(TEST_BINS) $(TEST_MODELS) $(BUILD)/test/format_vectors.ninfer
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; $$t; done
	@echo "== test/test_serve.py against the real engine (tiny, cpu path)"
	NINFER_SERVE_CMD="$(BUILD)/test/ninfer-serve $(MODELS)/tiny.ninfer" $(PYTHON) -m pytest -q test/test_serve.py
	NINFER_BIN=$(BUILD)/test/ninfer $(PYTHON) -m pytest -q test

clean:
	rm -rf $(BUILD)
