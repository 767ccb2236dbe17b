#!/bin/bash
# SPDX-License-Identifier: MIT
#
# `make fuzz`: builds the libFuzzer targets of tests/fuzz in their own
# build directory (clang, -Dfuzz=true, ASan + UBSan) and runs each for
# FUZZ_TIME seconds, one after the other, starting from the seed corpus
# tests/fuzz/corpus/<target>/ (the inputs the fuzzer adds go to
# <build>/corpus/<target>/, never into the tree). Prints per target the
# executions and whether it found a crash; crash inputs land in
# tests/fuzz/crashes/ (gitignored): move one to tests/fuzz/regressions/
# <target>/ with the fix, and `make check` replays it from then on.
#
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_TIME (300), FUZZ_TARGETS
# ("open check write parse"), FUZZ_ARGS (more libFuzzer flags).
# Exit status: 1 if any target found a crash (or did not build).
set -uo pipefail

cd "$(dirname "$0")/../.."
BUILD=${FUZZ_BUILD:-build-fuzz}
TIME=${FUZZ_TIME:-300}
TARGETS=${FUZZ_TARGETS:-open check write parse}
CRASHES=tests/fuzz/crashes

# The longest input worth trying per target (image seeds are at most
# ~100 KiB; parsers take a line).
max_len() {
    case $1 in
    parse) echo 4096 ;;
    *) echo 131072 ;;
    esac
}

# Seconds one input may take before libFuzzer calls it a hang. A repair
# rebuilds refcounts over the whole host range a damaged image points at
# (a cluster at 16 GiB: 33 million 512-byte clusters), about a second
# natively as in qemu-img, but far longer under the fuzzer's
# instrumentation on a loaded machine.
timeout_for() {
    case $1 in
    check) echo 300 ;;
    *) echo 30 ;;
    esac
}

if [ ! -f "$BUILD/build.ninja" ]; then
    CC=clang meson setup "$BUILD" -Dfuzz=true -Db_sanitize=address,undefined \
        -Db_lundef=false -Dwerror=false -Dman=disabled || exit 1
fi
exes=()
for t in $TARGETS; do
    exes+=("tests/fuzz/fuzz_$t")
done
ninja -C "$BUILD" "${exes[@]}" || exit 1

# How many findings of target $1 are in $CRASHES (crash, leak, timeout,
# out of memory; not the slow units libFuzzer also writes there).
findings() {
    find "$CRASHES" \( -name "$1-crash-*" -o -name "$1-leak-*" -o \
        -name "$1-timeout-*" -o -name "$1-oom-*" \) | wc -l
}

mkdir -p "$CRASHES"
# The targets' scratch files (left behind by a crash): tmpfs, removed here.
SCRATCH=$(mktemp -d /dev/shm/blkimg-fuzz-run.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
export BLKIMG_FUZZ_DIR=$SCRATCH
status=0
summary=()
for t in $TARGETS; do
    corpus=$BUILD/corpus/$t
    log=$BUILD/fuzz-$t.log
    mkdir -p "$corpus"
    echo "==== fuzz_$t: ${TIME}s (log: $log)"
    before=$(findings "$t")
    # shellcheck disable=SC2086
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$TIME" \
        -max_len="$(max_len "$t")" -timeout="$(timeout_for "$t")" \
        -print_final_stats=1 \
        -artifact_prefix="$CRASHES/$t-" ${FUZZ_ARGS:-} \
        "$corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    after=$(findings "$t")
    if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
        kind=CRASH
        if grep -q "ERROR: libFuzzer: timeout" "$log"; then
            kind=TIMEOUT
        fi
        result="$kind (exit $rc; inputs in $CRASHES/$t-*)"
        status=1
    else
        result="no crash"
    fi
    line=$(printf 'fuzz_%-6s %10s executions, %s' "$t" "${execs:-?}" "$result")
    echo "$line"
    summary+=("$line")
done
echo
echo "==== fuzz summary (${TIME}s per target)"
printf '%s\n' "${summary[@]}"
exit $status
