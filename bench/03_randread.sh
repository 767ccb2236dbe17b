#!/bin/bash
# SPDX-License-Identifier: MIT
#
# 4 KiB random reads, queue depth 32, cache=none, on one 1 GiB raw file of
# random data: `blkimg bench` vs `qemu-img bench` (its default engine, and
# io_uring for reference) vs fio (io_uring, O_DIRECT).
# Goal: blkimg >= 2x qemu-img bench, >= 0.85x fio.
set -uo pipefail
BENCH_NAME="randread-4k-qd32"
. "$(dirname "$0")/lib.sh"

title "3. 4 KiB reads, QD32, cache=none, 1 GiB raw file: blkimg bench vs qemu-img bench vs fio"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
command -v fio >/dev/null || skip "fio missing"

RAW="$BENCH_DIR/raw1g.img"
ensure_random_raw "$RAW" 1024
count=$(quick 20000 100000)
runtime=$(quick 2 5)

if has_bench_option --random "$RAW"; then
    ours_args=(--random)
    ours_mode="random offsets (--random)"
else
    ours_args=(-S 4096)
    ours_mode="sequential, step 4096 (no --random option)"
fi

iops_of() { # COUNT SECONDS
    awk -v c="$1" -v t="$2" 'BEGIN{ if (t == "" || t + 0 == 0) print "-"; else printf "%.0f", c / t }'
}

declare -A IOPS MODE
run_bench() { # LABEL MODE CMD...
    local label=$1 mode=$2
    shift 2
    local v=() s i
    for ((i = 0; i < BENCH_REPS; i++)); do
        s=$(bench_seconds "$@")
        [ -n "$s" ] || break
        v+=("$(iops_of "$count" "$s")")
    done
    if [ ${#v[@]} -gt 0 ]; then IOPS[$label]=$(median "${v[@]}"); else IOPS[$label]="-"; fi
    MODE[$label]=$mode
}

run_bench "blkimg bench" "$ours_mode" \
    "$BLKIMG" bench -f raw -t none -d 32 -s 4096 -c "$count" "${ours_args[@]}" "$RAW"
run_bench "qemu-img bench" "sequential, step 4096 (aio=threads)" \
    qemu-img bench -f raw -t none -d 32 -s 4096 -c "$count" "$RAW"
run_bench "qemu-img bench -i io_uring" "sequential, step 4096" \
    qemu-img bench -f raw -t none -i io_uring -d 32 -s 4096 -c "$count" "$RAW"

v=()
for ((i = 0; i < BENCH_REPS; i++)); do
    x=$(fio --name=randread --filename="$RAW" --ioengine=io_uring --direct=1 \
        --rw=randread --bs=4k --iodepth=32 --runtime="$runtime" --time_based \
        --output-format=json 2>/dev/null |
        "$PY" -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["jobs"][0]["read"]["iops"])' 2>/dev/null)
    [ -n "$x" ] && v+=("$x")
done
if [ ${#v[@]} -gt 0 ]; then IOPS[fio]=$(median "${v[@]}"); else IOPS[fio]="-"; fi
MODE[fio]="random (io_uring, direct=1)"

ours=${IOPS["blkimg bench"]}
printf '  %-28s %10s %14s   %s\n' tool IOPS "blkimg ratio" "access pattern"
for l in "blkimg bench" "qemu-img bench" "qemu-img bench -i io_uring" fio; do
    printf '  %-28s %10s %14s   %s\n' "$l" "${IOPS[$l]}" "$(ratio "$ours" "${IOPS[$l]}")" "${MODE[$l]}"
done
rq=$(ratio "$ours" "${IOPS["qemu-img bench"]}")
rf=$(ratio "$ours" "${IOPS[fio]}")
note "blkimg / qemu-img bench = $rq (goal >= 2: $(verdict "$rq" ">=" 2)); blkimg / fio = $rf (goal >= 0.85: $(verdict "$rf" ">=" 0.85))"
result "4 KiB reads QD32" "qemu-img bench" IOPS "$ours" \
    "${IOPS["qemu-img bench"]}" "$rq" ">=" 2
result "4 KiB reads QD32" "qemu-img bench -i io_uring" IOPS "$ours" \
    "${IOPS["qemu-img bench -i io_uring"]}" \
    "$(ratio "$ours" "${IOPS["qemu-img bench -i io_uring"]}")" - -
result "4 KiB reads QD32" fio IOPS "$ours" "${IOPS[fio]}" "$rf" ">=" 0.85
summary "$BENCH_NAME" "IOPS blkimg/qemu-img bench = $rq (goal >= 2: $(verdict "$rq" ">=" 2)); blkimg/fio = $rf (goal >= 0.85: $(verdict "$rf" ">=" 0.85)); blkimg ${ours_mode}"
