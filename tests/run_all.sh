#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The whole test suite, as `make check` runs it:
#   1. build $BLKIMG_BUILD (default build/) and $BLKIMG_ASAN_BUILD (default
#      build-asan/, ASan + UBSan);
#   2. on each build: the unit tests (meson test) and the pytest suites
#      (tests/integration, tests/interop, with BLKIMG_BUILD pointing at it;
#      on the sanitizer build without the tests marked `slow`);
#   3. the clang-format check (one test).
# Every phase runs even when an earlier one failed. The LAST line printed is
# the total "N passed, N failed" (", N skipped" follows when tests were
# skipped); the exit status is 1 when anything failed.
#
# Environment:
#   BLKIMG_BUILD, BLKIMG_ASAN_BUILD   build directories (relative to the repo)
#   BLKIMG_NO_ASAN=1                  skip the sanitizer build and run
#   PYTEST_ARGS                       extra pytest arguments (e.g. "-k info")
#   PYTEST_TIMEOUT                    per-test timeout in seconds (600)
#   PYTEST_JOBS                       parallel pytest workers (2, needs
#                                     pytest-xdist; 1 runs them in order)
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
BUILD=${BLKIMG_BUILD:-build}
ASAN_BUILD=${BLKIMG_ASAN_BUILD:-build-asan}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-600}
PYTEST_JOBS=${PYTEST_JOBS:-2}

# intercept_tls_get_addr=0: GCC 12's LeakSanitizer crashes in its
# tracer ("Tracer caught signal 11", then "LeakSanitizer has encountered
# a fatal error") when it walks the dynamic TLS of a library loaded with
# dlopen after start-up, as libcurl and GnuTLS are at the first https
# open; its static TLS and heap scans are unchanged.
export ASAN_OPTIONS_CHECK="halt_on_error=1:abort_on_error=0:detect_leaks=1:print_stacktrace=1:exitcode=86:intercept_tls_get_addr=0"
export UBSAN_OPTIONS_CHECK="halt_on_error=1:abort_on_error=0:print_stacktrace=1:exitcode=86"

TALLY=$(mktemp /tmp/blkimg-check.XXXXXX)
trap 'rm -f "$TALLY"' EXIT
START=$(date +%s)

# record NAME PASSED FAILED SKIPPED
record() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$TALLY"
}

banner() {
    echo
    echo "==== $* ===="
}

# build DIR [meson setup args...]: configure (once) and build; 0 on success.
build() {
    local dir=$1
    shift
    banner "build $dir/ $*"
    if [ -f "$dir/build.ninja" ]; then
        if [ $# -gt 0 ]; then
            meson configure "$dir" "$@" || return 1
        fi
    else
        meson setup "$dir" "$@" || return 1
    fi
    ninja -C "$dir"
}

# unit DIR LABEL [meson test args...]
unit() {
    local dir=$1 label=$2
    shift 2
    banner "unit tests ($label)"
    rm -f "$dir/meson-logs/testlog.json"
    meson test -C "$dir" --no-rebuild --print-errorlogs "$@"
    local counts
    counts=$("$PY" tests/tally.py meson "$dir") || counts="0 1 0"
    # shellcheck disable=SC2086
    record "unit ($label)" $counts
}

# pysuite DIR LABEL [pytest args...]: the pytest suites against the binaries
# in DIR.
pysuite() {
    local dir=$1 label=$2
    shift 2
    banner "pytest suites ($label)"
    local suites=() d
    for d in tests/integration tests/interop; do
        [ -d "$d" ] && suites+=("$d")
    done
    local xml="$REPO/$dir/pytest-results.xml" rc timeout_args=()
    rm -f "$xml"
    if "$PY" -c 'import pytest_timeout' 2>/dev/null; then
        timeout_args=(--timeout="$PYTEST_TIMEOUT")
    fi
    local jobs_args=()
    if [ "$PYTEST_JOBS" -gt 1 ] && "$PY" -c 'import xdist' 2>/dev/null; then
        jobs_args=(-n "$PYTEST_JOBS")
    fi
    # shellcheck disable=SC2086
    BLKIMG_BUILD="$REPO/$dir" "$PY" -m pytest -p no:cacheprovider -q \
        --tb=short -rfEs --durations=10 "${timeout_args[@]}" "${jobs_args[@]}" \
        --junitxml="$xml" "$@" ${PYTEST_ARGS:-} "${suites[@]}" </dev/null
    rc=$?
    local counts
    counts=$("$PY" tests/tally.py junit "$xml" "$rc") || counts="0 1 0"
    # shellcheck disable=SC2086
    record "pytest ($label)" $counts
}

# --- normal build ------------------------------------------------------------
if build "$BUILD"; then
    record "build ($BUILD)" 0 0 0
    unit "$BUILD" "$BUILD" --num-processes 2
    # the longest trials are make torture's
    pysuite "$BUILD" "$BUILD" -m "not torture"
else
    echo "check: build of $BUILD/ FAILED; its tests were not run"
    record "build ($BUILD)" 0 1 0
fi

# --- ASan + UBSan build ------------------------------------------------------
if [ "${BLKIMG_NO_ASAN:-0}" != 1 ]; then
    # Warnings are enforced by the normal build; GCC's -O2 warnings under
    # the sanitizers include known false positives (stringop-overread...).
    if build "$ASAN_BUILD" -Db_sanitize=address,undefined -Dwerror=false; then
        record "build ($ASAN_BUILD)" 0 0 0
        (
            export ASAN_OPTIONS=$ASAN_OPTIONS_CHECK
            export UBSAN_OPTIONS=$UBSAN_OPTIONS_CHECK
            unit "$ASAN_BUILD" "$ASAN_BUILD" --num-processes 2 \
                --timeout-multiplier 4
            # Tests marked slow (long trials, big images) run on the normal
            # build only.
            pysuite "$ASAN_BUILD" "$ASAN_BUILD" -m "not slow and not torture"
        )
    else
        echo "check: build of $ASAN_BUILD/ FAILED; its tests were not run"
        record "build ($ASAN_BUILD)" 0 1 0
    fi
fi

# --- formatting ----------------------------------------------------------------
banner "clang-format check"
if scripts/check-format.sh; then
    record "clang-format" 1 0 0
else
    record "clang-format" 0 1 0
fi

# --- summary -------------------------------------------------------------------
banner "summary ($(($(date +%s) - START)) s)"
while IFS=$'\t' read -r name p f s; do
    status=ok
    [ "$f" -gt 0 ] && status=FAILED
    printf '  %-28s %5s passed %5s failed %5s skipped  %s\n' \
        "$name" "$p" "$f" "$s" "$status"
done <"$TALLY"
read -r P F S < <("$PY" tests/tally.py sum "$TALLY")
line="$P passed, $F failed"
[ "$S" -gt 0 ] && line="$line, $S skipped"
echo "$line"
[ "$F" -eq 0 ]
