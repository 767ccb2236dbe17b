#!/bin/bash
# SPDX-License-Identifier: MIT
#
# A fully allocated qcow2 vs the same data as a raw file, cache=none:
# 1 MiB sequential reads and 4 KiB random reads at queue depth 32, with
# `blkimg bench` (qemu-img bench on the same files for reference).
# Goal: blkimg qcow2 >= 0.95x raw (sequential), >= 0.9x raw (random).
set -uo pipefail
BENCH_NAME="qcow2-vs-raw-reads"
. "$(dirname "$0")/lib.sh"

title "4. Fully allocated qcow2 vs raw, cache=none: 1 MiB sequential and 4 KiB QD32 reads"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"

RAW="$BENCH_DIR/raw1g.img"
QCOW2="$BENCH_DIR/raw1g.qcow2"
ensure_random_raw "$RAW" 1024
if [ ! -f "$QCOW2" ] || [ "$QCOW2" -ot "$RAW" ]; then
    note "creating $QCOW2 (qemu-img convert, 64 KiB clusters, fully allocated)"
    qemu-img convert -f raw -O qcow2 "$RAW" "$QCOW2" || skip "qemu-img convert failed"
fi
"$BLKIMG" info -f qcow2 "$QCOW2" >/dev/null 2>&1 ||
    skip "blkimg cannot open qcow2 images yet ($("$BLKIMG" info -f qcow2 "$QCOW2" 2>&1 | head -n 1))"

if has_bench_option --random "$RAW"; then
    rnd=(--random)
    rnd_mode="random offsets"
else
    rnd=(-S 4096)
    rnd_mode="sequential 4 KiB steps (no --random option)"
fi

seq_count=$(quick 1024 4096)
rnd_count=$(quick 20000 100000)

# one TOOL FMT FILE SIZE COUNT EXTRA...: MiB/s (1M) or IOPS (4k) of one run
one() {
    local tool=$1 f=$2 file=$3 size=$4 count=$5 s
    shift 5
    s=$(bench_seconds "$tool" bench -f "$f" -t none -d 32 -s "$size" -c "$count" "$@" "$file")
    [ -n "$s" ] || return 0
    if [ "$size" = 1M ]; then
        awk -v c="$count" -v t="$s" 'BEGIN{printf "%.1f", c / t}'
    else
        awk -v c="$count" -v t="$s" 'BEGIN{printf "%.0f", c / t}'
    fi
}

# The machine is shared and its disk throughput drifts by 2x within
# seconds, so the runs are interleaved: every repetition measures raw and
# qcow2 back to back, and the qcow2/raw ratio is the median of the ratios
# of those pairs (more repetitions than elsewhere: BENCH_REPS * 3).
CONFIGS=(
    "b_seq|$BLKIMG|1M|$seq_count"
    "b_rnd|$BLKIMG|4096|$rnd_count|${rnd[*]}"
    "q_seq|qemu-img|1M|$seq_count"
    "q_rnd|qemu-img|4096|$rnd_count|-S 4096"
)
declare -A V
reps=$((BENCH_REPS * 3))
[ "$BENCH_QUICK" = 1 ] && reps=1
for ((i = 0; i < reps; i++)); do
    for c in "${CONFIGS[@]}"; do
        IFS='|' read -r key tool size count extra <<<"$c"
        # the order alternates so that neither side always goes first
        if ((i % 2)); then
            # shellcheck disable=SC2086
            q=$(one "$tool" qcow2 "$QCOW2" "$size" "$count" $extra)
            # shellcheck disable=SC2086
            r=$(one "$tool" raw "$RAW" "$size" "$count" $extra)
        else
            # shellcheck disable=SC2086
            r=$(one "$tool" raw "$RAW" "$size" "$count" $extra)
            # shellcheck disable=SC2086
            q=$(one "$tool" qcow2 "$QCOW2" "$size" "$count" $extra)
        fi
        [ -n "$r" ] && [ -n "$q" ] || continue
        V[${key}_raw]+=" $r"
        V[${key}_q]+=" $q"
        V[${key}_ratio]+=" $(ratio "$q" "$r")"
    done
done
med() {
    # shellcheck disable=SC2086
    if [ -n "${V[$1]:-}" ]; then median ${V[$1]}; else echo "-"; fi
}
b_seq_raw=$(med b_seq_raw) b_seq_q=$(med b_seq_q)
b_rnd_raw=$(med b_rnd_raw) b_rnd_q=$(med b_rnd_q)
q_seq_raw=$(med q_seq_raw) q_seq_q=$(med q_seq_q)
q_rnd_raw=$(med q_rnd_raw) q_rnd_q=$(med q_rnd_q)

rs=$(fmt "$(med b_seq_ratio)" 2)
rr=$(fmt "$(med b_rnd_ratio)" 2)
note "$reps interleaved repetitions; ratios are medians of per-repetition qcow2/raw pairs"
printf '  %-34s %10s %10s %12s %14s\n' workload raw qcow2 "qcow2/raw" "vs qemu-img"
printf '  %-34s %10s %10s %12s %14s\n' "blkimg 1 MiB seq QD32 (MiB/s)" "$b_seq_raw" "$b_seq_q" "$rs" "$(ratio "$b_seq_q" "$q_seq_q")"
printf '  %-34s %10s %10s %12s %14s\n' "qemu-img 1 MiB seq QD32 (MiB/s)" "$q_seq_raw" "$q_seq_q" "$(fmt "$(med q_seq_ratio)" 2)" ""
printf '  %-34s %10s %10s %12s %14s\n' "blkimg 4 KiB QD32 (IOPS)" "$b_rnd_raw" "$b_rnd_q" "$rr" "$(ratio "$b_rnd_q" "$q_rnd_q")"
printf '  %-34s %10s %10s %12s %14s\n' "qemu-img 4 KiB seq QD32 (IOPS)" "$q_rnd_raw" "$q_rnd_q" "$(fmt "$(med q_rnd_ratio)" 2)" ""
note "blkimg 4 KiB: $rnd_mode; qemu-img bench has no random mode"
note "qcow2/raw: sequential $rs (goal >= 0.95: $(verdict "$rs" ">=" 0.95)), 4 KiB $rr (goal >= 0.9: $(verdict "$rr" ">=" 0.9))"
result "qcow2 1 MiB sequential reads" "blkimg on raw" "MiB/s" "$b_seq_q" \
    "$b_seq_raw" "$rs" ">=" 0.95
result "qcow2 4 KiB reads QD32" "blkimg on raw" IOPS "$b_rnd_q" \
    "$b_rnd_raw" "$rr" ">=" 0.9
result "qcow2 1 MiB sequential reads" qemu-img "MiB/s" "$b_seq_q" \
    "$q_seq_q" "$(ratio "$b_seq_q" "$q_seq_q")" - -
summary "$BENCH_NAME" "blkimg qcow2/raw: 1 MiB seq $rs (goal >= 0.95: $(verdict "$rs" ">=" 0.95)); 4 KiB QD32 $rr (goal >= 0.9: $(verdict "$rr" ">=" 0.9))"
