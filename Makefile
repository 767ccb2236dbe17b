# SPDX-License-Identifier: MIT
#
# blkimg: top-level entry points. The real build is meson + ninja; this
# file only strings the steps together.
#
#   make              build build/ (blkimg, blkimg-io, libblkimg.so)
#   make run          install missing packages, build, run the demo
#   make check        install missing packages, build build/ and build-asan/,
#                     run every test on both, check formatting; the last
#                     line printed is "N passed, N failed"
#   make torture      build, then the long trials: 20000 damaged qcow2
#                     images judged by blkimg check and qemu-img check
#                     (TORTURE_CASES, TORTURE_SEED), 2000 power-loss
#                     trials (TORTURE_POWERLOSS), and the tests marked
#                     torture (the full SIGKILL crash trials)
#   make fuzz         build the libFuzzer targets (build-fuzz/, clang) and
#                     run each for FUZZ_TIME seconds (300); crash inputs go
#                     to tests/fuzz/crashes/ (tests/fuzz/run.sh)
#   make bench        build, then run the benchmarks (bench/run.sh); the
#                     report, results and charts go to build/bench-results/
#   make install      meson install (PREFIX=/usr/local, DESTDIR honoured):
#                     tools, library, headers, pkg-config file, man pages,
#                     bash completion
#   make symbols      rewrite debian/libblkimg1.symbols (the exported
#                     symbols on record) from build/libblkimg.so
#   make format       clang-format -i on every C file
#   make clean        remove build/, build-asan/, build-fuzz/ and demo/

BUILD      ?= build
ASAN_BUILD ?= build-asan
PREFIX     ?= /usr/local
MESON      ?= meson
NINJA      ?= ninja
CC         ?= cc

# C files we format / check (never anything under a build directory).
C_DIRS     := src include tests bench examples

.PHONY: all build deps run check torture fuzz bench bench-tools install \
	format check-format clean symbols

all: build

deps:
	@scripts/deps.sh

$(BUILD)/build.ninja:
	$(MESON) setup $(BUILD)

build: $(BUILD)/build.ninja
	$(NINJA) -C $(BUILD)

# Small C helpers for the benchmarks, kept out of meson on purpose.
bench-tools: $(BUILD)/bench/dio_align $(BUILD)/bench/xts_speed

$(BUILD)/bench/dio_align: bench/dio_align.c
	@mkdir -p $(BUILD)/bench
	$(CC) -O2 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -o $@ $<

$(BUILD)/bench/xts_speed: bench/xts_speed.c
	@mkdir -p $(BUILD)/bench
	$(CC) -O2 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -o $@ $< \
		$$(pkg-config --cflags --libs libgcrypt)

run: deps build
	@BLKIMG_BUILD=$(BUILD) scripts/demo.sh

check: deps
	@BLKIMG_BUILD=$(BUILD) BLKIMG_ASAN_BUILD=$(ASAN_BUILD) tests/run_all.sh

TORTURE_CASES     ?= 20000
TORTURE_SEED      ?= 100000
TORTURE_POWERLOSS ?= 2000

torture: deps build
	@python3 tests/interop/qcow2_mutate.py $(abspath $(BUILD)) \
		$(TORTURE_CASES) $(TORTURE_SEED); a=$$?; \
	python3 tests/interop/powerloss_trials.py $(abspath $(BUILD)) \
		$(TORTURE_POWERLOSS) $(TORTURE_SEED); b=$$?; \
	BLKIMG_BUILD=$(abspath $(BUILD)) /usr/bin/python3 -m pytest -q \
		-p no:cacheprovider -m torture tests/integration tests/interop; \
	c=$$?; [ $$a -eq 0 ] && [ $$b -eq 0 ] && [ $$c -eq 0 ]

FUZZ_BUILD ?= build-fuzz
FUZZ_TIME  ?= 300

fuzz:
	@scripts/deps.sh --fuzz
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_TIME=$(FUZZ_TIME) tests/fuzz/run.sh

bench: build bench-tools
	@BLKIMG_BUILD=$(BUILD) bench/run.sh

install: $(BUILD)/build.ninja
	$(MESON) configure $(BUILD) -Dprefix=$(PREFIX)
	$(NINJA) -C $(BUILD)
	$(MESON) install -C $(BUILD) $(if $(DESTDIR),--destdir $(DESTDIR))

# The library's exported symbols on record: new symbols get the project's
# version as their minimum version, listed ones keep theirs.
symbols: build
	@python3 scripts/libsymbols.py update debian/libblkimg1.symbols \
		$(BUILD)/libblkimg.so \
		$$(sed -n "s/^  version : '\(.*\)',$$/\1/p" meson.build | head -n 1)

format:
	@find $(C_DIRS) -name '*.[ch]' -print0 | \
		xargs -0 -r clang-format -i

check-format:
	@scripts/check-format.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) demo
