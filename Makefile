# pi2 — build, test, demo. See README.md.
#   make            build the library and the three tools into build/
#   make build-all  every tool, test binary and fuzz replay, without running them
#   make test       unit + end-to-end tests (installs missing Debian -dev packages when root);
#                   each test binary under TEST_TIMEOUT seconds (600), TEST_JOBS unit binaries at once (2)
#   make unit       the cmocka unit tests only (no fuzz replay, no end-to-end)
#   make san-test   the same tests built with ASan + UBSan into build-san/, then the
#                   threaded tests (pool, I/O, engine, hardware profile) with TSan into build-tsan/
#   make demo       make a model, convert, run: the main job end to end
#   make bench      benchmarks (figures as ratios to a baseline measured in the same run)
#   make fuzz       libFuzzer targets of the file readers (clang), each run FUZZ_SECONDS
#   make ARCH=aarch64            cross-build the same targets for arm64 Linux into build-arm64/
#                                (aarch64-linux-gnu-gcc and the arm64 -dev packages; natively on
#                                an arm64 machine plain `make` is enough)
#   make test-arm64              that build's unit tests and an end-to-end run under qemu-aarch64
#                                (baseline and extended CPU models), tokens checked against this build's

CC      ?= cc
AR      ?= ar
# ARCH=aarch64 on another machine cross-compiles with CROSS (a CC or AR
# given on the command line or in the environment wins).
ifeq ($(ARCH),aarch64)
ifneq ($(shell uname -m),aarch64)
CROSS   ?= aarch64-linux-gnu-
endif
ifeq ($(origin CC),default)
CC      := $(CROSS)gcc
endif
ifeq ($(origin AR),default)
AR      := $(CROSS)ar
endif
BUILD   ?= build-arm64
endif
BUILD   ?= build
SHARED  ?= $(abspath ../shared)
WARN    := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes
OPT     ?= -O2 -g
CFLAGS  ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE -I. $(WARN) $(OPT) -pthread -MMD -MP
ifdef WERROR
CFLAGS  += -Werror
endif
ifdef SAN
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ifdef TSAN
CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS += -fsanitize=thread
endif
# GCC 12 for aarch64 (Debian 12's, cross and native) stops with an internal
# error vectorizing some of the tests' max-of-|x| loops: the tests' own
# objects skip loop vectorization there (the library's code is untouched).
ifneq ($(filter aarch64%,$(shell $(CC) -dumpmachine 2>/dev/null)),)
$(BUILD)/obj/tests/%.o: CFLAGS += -fno-tree-loop-vectorize
endif
LDLIBS  := -larchive -lcrypto -lopenblas -ljansson -luring -lmicrohttpd -lm -lpthread

TOOLS     := pi2-convert pi2-bundle pi2-run
TOOL_SRC  := convert/pi2-convert.c bundle/pi2-bundle.c runtime/pi2-run.c
# pi2-run's subcommands: part of the tool, not of the library.
CLI_SRC   := $(wildcard runtime/cli/*.c)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
LIB_SRC   := $(filter-out $(TOOL_SRC) runtime/version.c,$(wildcard formats/*.c convert/*.c bundle/*.c predictor/*.c runtime/*.c runtime/kernels/*.c runtime/offload/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
LIB       := $(BUILD)/libpi2.a
# Fuzz targets (tests/fuzz/fuzz_<t>.c); `make test` replays their corpora.
FUZZ_TGT  := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_TGT:%=$(BUILD)/fuzz/replay-%)

.PHONY: FORCE all build-all test test-arm64 unit san san-test tsan-test demo bench deps clean fuzz fuzz-build
all: $(TOOLS:%=$(BUILD)/%)

deps:
	@sh tests/deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# --version: the git description and commit date, compiled into version.o
# (the tools only), rebuilt when they change
PI2_VERSION    := $(shell git describe --always --tags 2>/dev/null || echo unknown)
PI2_BUILD_DATE := $(shell git log -1 --format=%cd --date=short 2>/dev/null || echo unknown)
VERSION_OBJ    := $(BUILD)/obj/runtime/version.o
$(BUILD)/version.stamp: FORCE
	@mkdir -p $(BUILD)
	@echo '$(PI2_VERSION) $(PI2_BUILD_DATE)' | cmp -s - $@ || echo '$(PI2_VERSION) $(PI2_BUILD_DATE)' >$@
$(VERSION_OBJ): $(BUILD)/version.stamp
$(VERSION_OBJ): CFLAGS += -DPI2_VERSION='"$(PI2_VERSION)"' -DPI2_BUILD_DATE='"$(PI2_BUILD_DATE)"'
FORCE:

$(BUILD)/pi2-convert: $(BUILD)/obj/convert/pi2-convert.o $(VERSION_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/pi2-bundle: $(BUILD)/obj/bundle/pi2-bundle.o $(VERSION_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/pi2-run: $(BUILD)/obj/runtime/pi2-run.o $(VERSION_OBJ) $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

$(BUILD)/fuzz/replay-%: $(BUILD)/obj/tests/fuzz/replay.o $(BUILD)/obj/tests/fuzz/fuzz_%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/fuzz/gen-seeds: $(BUILD)/obj/tests/fuzz/gen_seeds.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# Every tool, test binary and fuzz replay, built and not run (the cross build's check).
build-all: all $(TEST_BIN) $(FUZZ_REPLAY)

test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN) $(FUZZ_REPLAY)
	@BUILD=$(BUILD) PI2_SHARED=$(SHARED) sh tests/run.sh $(TEST_BIN)

# The arm64 cross build under qemu-aarch64 (tests/arm64.sh builds both).
test-arm64: deps
	@PI2_SHARED=$(SHARED) WERROR=$(WERROR) sh tests/arm64.sh

unit: deps
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@BUILD=$(BUILD) PI2_SHARED=$(SHARED) PI2_UNIT_ONLY=1 sh tests/run.sh $(TEST_BIN)

san:
	@$(MAKE) --no-print-directory BUILD=build-san SAN=1 OPT="-O1 -g" all

# Tests of threaded code, also run under ThreadSanitizer (make tsan-test).
TSAN_TESTS := test_pool test_io test_engine test_kernels test_offload test_ncache test_hwprof

san-test: deps
	@$(MAKE) --no-print-directory BUILD=build-san SAN=1 OPT="-O1 -g" test
	@$(MAKE) --no-print-directory tsan-test

tsan-test: deps
	@$(MAKE) --no-print-directory BUILD=build-tsan TSAN=1 OPT="-O1 -g" $(TSAN_TESTS:%=build-tsan/tests/%)
	@BUILD=build-tsan PI2_SHARED=$(SHARED) PI2_UNIT_ONLY=1 TSAN_OPTIONS="halt_on_error=1" \
	    sh tests/run.sh $(TSAN_TESTS:%=build-tsan/tests/%)

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh tests/demo.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh tests/bench.sh

# ---- fuzzing (clang + libFuzzer; the readers built with the same sanitizers) ----
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_FLAGS   := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -I. $(WARN) -O1 -g -pthread -MMD -MP $(FUZZ_FLAGS)
FUZZ_LIBSRC  := $(LIB_SRC)
FUZZ_LIBOBJ  := $(FUZZ_LIBSRC:%.c=$(FUZZ_BUILD)/obj/%.o)
FUZZ_BIN     := $(FUZZ_TGT:%=$(FUZZ_BUILD)/fuzz_%)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_LIBOBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined $^ -o $@ $(LDLIBS)

# Keep the objects (make would delete them as intermediates of the chain).
.SECONDARY: $(FUZZ_LIBOBJ) $(FUZZ_TGT:%=$(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o) \
    $(BUILD)/obj/tests/fuzz/replay.o $(BUILD)/obj/tests/fuzz/gen_seeds.o $(FUZZ_TGT:%=$(BUILD)/obj/tests/fuzz/fuzz_%.o)

fuzz-build:
	@FUZZ_CC=$(FUZZ_CC) sh tests/deps.sh fuzz
	@$(MAKE) --no-print-directory $(FUZZ_BIN)

# One target at a time, in-process (no -jobs: one core): new corpus entries go to a scratch dir
# ($(FUZZ_BUILD)/corpus/<t>), crashes to tests/fuzz/crashes/<t>/.
fuzz: fuzz-build
	@for t in $(FUZZ_TGT); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t tests/fuzz/crashes/$$t; \
	    echo "fuzz $$t: $(FUZZ_SECONDS) s"; \
	    ASAN_OPTIONS=detect_leaks=1 $(FUZZ_BUILD)/fuzz_$$t $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t \
	        -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 \
	        -timeout=10 -print_final_stats=1 -artifact_prefix=tests/fuzz/crashes/$$t/ \
	        $$(case $$t in hfconfig|tokenizer|manifest|plan|hwprof) echo -dict=tests/fuzz/json.dict;; esac) \
	        $(FUZZ_ARGS) || exit 1; \
	done

clean:
	rm -rf build build-san build-tsan build-fuzz build-arm64

-include $(LIB_OBJ:.o=.d) $(VERSION_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TOOL_SRC:%.c=$(BUILD)/obj/%.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)
-include $(wildcard $(BUILD)/obj/tests/fuzz/*.d $(FUZZ_BUILD)/obj/*/*.d $(FUZZ_BUILD)/obj/*/*/*.d \
    $(FUZZ_BUILD)/obj/tests/fuzz/*.d)
