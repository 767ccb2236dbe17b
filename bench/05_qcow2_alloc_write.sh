#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Allocating writes: 64 KiB, queue depth 16, cache=none, into an empty
# 1 GiB qcow2 (made fresh by qemu-img for every run): `blkimg bench -w` vs
# `qemu-img bench -w`, interleaved runs in alternating order. Every written
# image is checked with qemu-img check.
# Goal: blkimg >= 1.3x qemu-img.
set -uo pipefail
BENCH_NAME="qcow2-alloc-writes"
. "$(dirname "$0")/lib.sh"

title "5. Allocating 64 KiB writes, QD16, cache=none, into an empty qcow2"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"

IMG="$BENCH_DIR/alloc.qcow2"
fresh() {
    rm -f "$IMG"
    qemu-img create -q -f qcow2 "$IMG" 1G
}
fresh
"$BLKIMG" info -f qcow2 "$IMG" >/dev/null 2>&1 ||
    skip "blkimg cannot open qcow2 images yet ($("$BLKIMG" info -f qcow2 "$IMG" 2>&1 | head -n 1))"

count=$(quick 4096 16384) # 16384 x 64 KiB = the whole 1 GiB
reps=$((BENCH_REPS * 2 - 1))
note "$reps interleaved runs per tool, alternating order (median)"
declare -A CHECK
CHECK[blkimg]=ok
CHECK[qemu-img]=ok
declare -a vb=() vq=()
for ((i = 0; i < reps; i++)); do
    order=(blkimg qemu-img)
    ((i % 2)) && order=(qemu-img blkimg)
    for tool in "${order[@]}"; do
        bin=qemu-img
        [ "$tool" = blkimg ] && bin=$BLKIMG
        fresh
        drop_caches
        s=$(bench_seconds "$bin" bench -w -f qcow2 -t none -d 16 -s 64k -c "$count" "$IMG")
        [ -n "$s" ] || { CHECK[$tool]="bench FAILED"; continue; }
        v=$(awk -v c="$count" -v t="$s" 'BEGIN{printf "%.1f", c * 64 / 1024 / t}')
        if [ "$tool" = blkimg ]; then vb+=("$v"); else vq+=("$v"); fi
        if ! qemu-img check -q -f qcow2 "$IMG" >/dev/null 2>&1; then
            CHECK[$tool]="qemu-img check FAILED"
        fi
    done
done
declare -A MBS
MBS[blkimg]=-
MBS[qemu-img]=-
[ ${#vb[@]} -gt 0 ] && MBS[blkimg]=$(median "${vb[@]}")
[ ${#vq[@]} -gt 0 ] && MBS[qemu-img]=$(median "${vq[@]}")
rm -f "$IMG"

r=$(ratio "${MBS[blkimg]}" "${MBS[qemu-img]}")
printf '  %-12s %10s %8s   %s\n' tool "MiB/s" ratio "image after the run"
printf '  %-12s %10s %8s   %s\n' blkimg "${MBS[blkimg]}" "$r" "${CHECK[blkimg]}"
printf '  %-12s %10s %8s   %s\n' qemu-img "${MBS[qemu-img]}" 1.00 "${CHECK[qemu-img]}"
note "blkimg / qemu-img = $r (goal >= 1.3: $(verdict "$r" ">=" 1.3))"
result "64 KiB allocating writes QD16" qemu-img "MiB/s" "${MBS[blkimg]}" \
    "${MBS[qemu-img]}" "$r" ">=" 1.3
summary "$BENCH_NAME" "64 KiB QD16 allocating writes blkimg/qemu-img = $r (goal >= 1.3: $(verdict "$r" ">=" 1.3)); qemu-img check: ${CHECK[blkimg]}"
