# hutch build.  Plain GNU make over pkg-config; see docs/building.md.
#
#   make              build everything into build/
#   make test         the whole test suite (unit, unit under ASan+UBSan, integration)
#   make unit         C unit tests (TAP, run with prove)
#   make SAN=1 BUILD=build-asan unit    unit tests under AddressSanitizer + UBSan
#   make bench        benchmarks (bench/README.md)

BUILD ?= build
CC ?= cc
PKGS := libmicrohttpd jansson sqlite3 libseccomp libcap libcurl libcrypto libzstd zlib libbtrfsutil libnftables libmnl

WARN := -Wall -Wextra -Werror=implicit-function-declaration -Werror=format-security \
        -Wshadow -Wmissing-prototypes -Wformat=2 -Wno-format-nonliteral -Wstrict-prototypes \
        -Wno-unused-parameter
CFLAGS ?= -O2 -g
VERSION := 0.1.0
CFLAGS += -std=gnu11 $(WARN) -Isrc/lib -D_GNU_SOURCE -fno-strict-aliasing -DHUTCH_VERSION=\"$(VERSION)\"
ifeq ($(SAN),1)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(WERROR),1)
CFLAGS += -Werror
endif
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS := $(shell pkg-config --libs $(PKGS)) -lpthread

LIB_SRCS := $(sort $(wildcard src/lib/*/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
# hutch-init is static and must not pull in the daemon's libraries.
INIT_SRCS := $(sort $(wildcard src/init/*.c)) src/lib/agent/proto.c src/lib/common/err.c src/lib/common/util.c src/lib/common/log.c
INIT_OBJS := $(INIT_SRCS:%.c=$(BUILD)/init-obj/%.o)

PROGS := $(BUILD)/hutchd $(BUILD)/hutch $(BUILD)/hutch-shim $(BUILD)/hutch-init $(BUILD)/hutch-gateway
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
HELPERS :=

.PHONY: all clean test unit unit-asan integration bench install demo fuzz clang-check
all: $(PROGS) $(HELPERS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/init-obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $< (static)"
	@$(CC) $(filter-out -fsanitize=%,$(CFLAGS)) -MMD -MP -c $< -o $@

$(BUILD)/libhutch.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/hutchd: $(BUILD)/src/hutchd/main.o $(BUILD)/libhutch.a
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

$(BUILD)/hutch: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/hutch/*.c)) $(BUILD)/libhutch.a
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

$(BUILD)/hutch-shim: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/shim/*.c)) $(BUILD)/libhutch.a
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

# The egress gateway (docs/network.md); it also needs libssl.
$(BUILD)/hutch-gateway: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/gateway/*.c)) $(BUILD)/libhutch.a
	$(CC) $(LDFLAGS) -o $@ $^ $(shell pkg-config --libs libssl) $(PKG_LIBS)

$(BUILD)/hutch-init: $(INIT_OBJS)
	$(CC) -static -o $@ $^

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(BUILD)/libhutch.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

unit: $(UNIT_BINS) $(BUILD)/hutch-init
	prove -f $(UNIT_BINS)

unit-asan:
	$(MAKE) SAN=1 BUILD=build-asan unit

integration: all
	HUTCH_BUILD=$(abspath $(BUILD)) /usr/bin/python3 -m pytest -ra -q tests/integration

# The README's second command.  Order: cheap and precise first.
test:
	$(MAKE) WERROR=1 all
	$(MAKE) clang-check
	$(MAKE) unit
	$(MAKE) unit-asan
	$(MAKE) fuzz
	$(MAKE) integration

# BENCH_ARGS: e.g. --quick (a smoke run), --no-save; see bench/README.md.
# Fuzz smoke: each libFuzzer driver for FUZZ_SECONDS (part of `make test`
# when clang is installed; longer runs: make fuzz FUZZ_SECONDS=600).
FUZZ_SECONDS ?= 10
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE -Isrc/lib
FUZZ_COMMON := src/lib/common/err.c src/lib/common/util.c
# One libFuzzer driver per parser of untrusted input: fuzz/<name>.c, with the
# library sources it needs in <name>_SRCS and extra libraries in <name>_LIBS.
FUZZ_TARGETS := fuzz_proto fuzz_json
fuzz_proto_SRCS := src/lib/agent/proto.c
fuzz_proto_ARGS := -max_len=70000
fuzz_json_SRCS := src/lib/api/json.c src/lib/runtime/spec.c
fuzz_json_LIBS := $(shell pkg-config --libs jansson)
FUZZ_TARGETS += fuzz_archive
fuzz_archive_SRCS := src/lib/store/archive.c src/lib/common/hash.c
fuzz_archive_LIBS := $(shell pkg-config --libs libzstd jansson libcrypto)
FUZZ_TARGETS += fuzz_tar
fuzz_tar_SRCS := src/lib/store/tarx.c src/lib/common/hash.c
fuzz_tar_LIBS := $(shell pkg-config --libs zlib libzstd jansson libcrypto)
FUZZ_TARGETS += fuzz_sni
fuzz_sni_SRCS := src/lib/net/sni.c src/lib/net/addr.c
fuzz_sni_ARGS := -max_len=20000
FUZZ_TARGETS += fuzz_http
fuzz_http_SRCS := src/lib/net/http.c src/lib/net/addr.c src/lib/net/policy.c
fuzz_http_LIBS := $(shell pkg-config --libs jansson)
fuzz_http_ARGS := -max_len=20000
FUZZ_TARGETS += fuzz_dns
fuzz_dns_SRCS := src/lib/gateway/dns.c src/lib/gateway/control.c src/lib/net/policy.c src/lib/net/addr.c
fuzz_dns_LIBS := $(shell pkg-config --libs jansson)
fuzz_dns_ARGS := -max_len=4096
fuzz:
	@if ! command -v clang >/dev/null; then echo "fuzz: clang not installed, skipped"; exit 0; fi; \
	mkdir -p $(BUILD)/fuzz && set -e && \
	$(foreach t,$(FUZZ_TARGETS),echo "  FUZZ    $(t)"; \
	  clang $(FUZZ_FLAGS) $(PKG_CFLAGS) fuzz/$(t).c $($(t)_SRCS) $(FUZZ_COMMON) -o $(BUILD)/fuzz/$(t) $($(t)_LIBS) && \
	  { $(BUILD)/fuzz/$(t) -max_total_time=$(FUZZ_SECONDS) $($(t)_ARGS) -print_final_stats=0 \
	      >$(BUILD)/fuzz/$(t).log 2>&1 || { tail -40 $(BUILD)/fuzz/$(t).log; exit 1; }; } && \
	  tail -1 $(BUILD)/fuzz/$(t).log && ) true

# gcc accepts a goto that jumps over a cleanup variable's declaration (the
# cleanup then frees garbage); clang refuses it.  Syntax only: seconds.
clang-check:
	@if ! command -v clang >/dev/null; then echo "clang-check: clang not installed, skipped"; exit 0; fi; \
	echo "  CLANG   -fsyntax-only"; \
	clang -fsyntax-only -std=gnu11 -Isrc/lib -D_GNU_SOURCE $(PKG_CFLAGS) -DHUTCH_VERSION=\"$(VERSION)\" \
	  $(LIB_SRCS) $(wildcard src/hutchd/*.c src/hutch/*.c src/shim/*.c src/init/*.c src/gateway/*.c)

bench: all
	HUTCH_BUILD=$(abspath $(BUILD)) /usr/bin/python3 bench/bench.py $(BENCH_ARGS)

demo: all
	./scripts/demo.sh

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
