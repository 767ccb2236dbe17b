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
# BENCH_QUICK=1 for a fast try, BENCH_KEEP=1 to keep the scratch files).
set -uo pipefail
cd "$(dirname "$0")"
BENCH_NAME=run
. ./lib.sh

BENCH_SUMMARY=$(mktemp /tmp/blkimg-bench-summary.XXXXXX)
export BENCH_SUMMARY BLKIMG_BUILD="$BUILD" BENCH_DIR BENCH_REPS BENCH_QUICK
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
