#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Runs the benchmarks side by side and ends with a summary of the headline
# ratios. Benchmarks are never tests: they print numbers, they do not fail.
#
#   bench/run.sh              all of them (`make bench` builds first)
#   bench/run.sh 03 07        only those whose file name starts with 03, 07
#
# Environment: see bench/lib.sh (BLKIMG_BUILD, BENCH_DIR, BENCH_REPS,
# BENCH_QUICK=1 for a fast try, BENCH_KEEP=1 to keep the scratch files),
# and BENCH_OUT: where the run's report (report.txt, what is printed),
# recorded results (results.tsv) and charts (one SVG per benchmark, drawn
# by bench/chart.py) are kept (default BUILD/bench-results/DATE-TIME).
set -uo pipefail
cd "$(dirname "$0")"
BENCH_NAME=run
. ./lib.sh

BENCH_OUT=${BENCH_OUT:-$BUILD/bench-results/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$BENCH_OUT" || exit 1
BENCH_OUT=$(cd "$BENCH_OUT" && pwd)
BENCH_RESULTS=$BENCH_OUT/results.tsv
: >"$BENCH_RESULTS"
BENCH_SUMMARY=$(mktemp /tmp/blkimg-bench-summary.XXXXXX)
export BENCH_SUMMARY BENCH_RESULTS BLKIMG_BUILD="$BUILD" BENCH_DIR BENCH_REPS \
    BENCH_QUICK
cleanup() {
    rm -f "$BENCH_SUMMARY"
    if [ "${BENCH_KEEP:-0}" != 1 ]; then
        rm -rf "$BENCH_DIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts=()
for s in [0-9][0-9]_*.sh; do
    if [ $# -eq 0 ]; then
        scripts+=("$s")
    else
        for want in "$@"; do
            case "$s" in "$want"*) scripts+=("$s") ;; esac
        done
    fi
done

# run_all: the benchmarks and the summary (what report.txt keeps).
run_all() {
    start=$(date +%s)
    echo "blkimg benchmarks — $(date -u '+%F %T') UTC"
    echo "  machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r)"
    echo "  scratch: $BENCH_DIR ($(df -T "$BENCH_DIR" | awk 'NR == 2 {print $2 " on " $1}')), $BENCH_REPS run(s) per measurement, median reported"
    echo "  blkimg:  $BLKIMG"
    echo "  qemu:    $(qemu-img --version 2>/dev/null | head -n 1)"
    echo "  fio:     $(fio --version 2>/dev/null)"

    for s in "${scripts[@]}"; do
        t0=$(date +%s)
        if ! bash "./$s"; then
            echo "  (benchmark $s ended with an error)"
            summary "$s" "ended with an error"
        fi
        echo "  [$s: $(($(date +%s) - t0)) s]"
    done

    echo
    echo "=== Summary (ratios: blkimg / reference) ==="
    while IFS=$'\t' read -r name text; do
        printf '  %-36s %s\n' "$name" "$text"
    done <"$BENCH_SUMMARY"
    echo "  total time: $(($(date +%s) - start)) s"
}

run_all 2>&1 | tee "$BENCH_OUT/report.txt"

# One chart per benchmark, beside the report.
echo
if command -v gnuplot >/dev/null 2>&1; then
    echo "charts (blkimg / reference, with the goals):"
    "$PY" ./chart.py "$BENCH_RESULTS" "$BENCH_OUT" | sed 's/^/  /'
else
    echo "charts: skipped (gnuplot missing; scripts/deps.sh installs it)"
fi
echo "report, results and charts: $BENCH_OUT"
