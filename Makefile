# pi2 — build, test, demo. See README.md.
#   make            build the library and the three tools into build/
#   make test       unit + end-to-end tests (installs missing Debian -dev packages when root)
#   make san-test   the same tests built with ASan + UBSan into build-san/
#   make demo       make a model, convert, run: the main job end to end
#   make bench      benchmarks (figures as ratios to a baseline measured in the same run)

CC      ?= cc
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
LDLIBS  := -larchive -lcrypto -lopenblas -ljansson -luring -lm -lpthread

TOOLS     := pi2-convert pi2-bundle pi2-run
TOOL_SRC  := convert/pi2-convert.c bundle/pi2-bundle.c runtime/pi2-run.c
LIB_SRC   := $(filter-out $(TOOL_SRC),$(wildcard formats/*.c convert/*.c bundle/*.c predictor/*.c runtime/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
LIB       := $(BUILD)/libpi2.a

.PHONY: all test san san-test demo bench deps clean
all: $(TOOLS:%=$(BUILD)/%)

deps:
	@sh tests/deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/pi2-convert: $(BUILD)/obj/convert/pi2-convert.o $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/pi2-bundle: $(BUILD)/obj/bundle/pi2-bundle.o $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/pi2-run: $(BUILD)/obj/runtime/pi2-run.o $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@BUILD=$(BUILD) PI2_SHARED=$(SHARED) sh tests/run.sh $(TEST_BIN)

san:
	@$(MAKE) --no-print-directory BUILD=build-san SAN=1 OPT="-O1 -g" all

san-test: deps
	@$(MAKE) --no-print-directory BUILD=build-san SAN=1 OPT="-O1 -g" test

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh tests/demo.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh tests/bench.sh

clean:
	rm -rf build build-san

-include $(LIB_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)
