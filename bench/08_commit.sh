#!/bin/bash
# SPDX-License-Identifier: MIT
#
# commit, blkimg vs qemu-img: a 2 GiB qcow2 base full of random data under
# a top that rewrote about half of it (runs of 64 KiB .. 4 MiB of random
# data). Each run commits a fresh copy of the pair; wall time, CPU time
# (user+sys) and peak memory (max RSS, /usr/bin/time), default cache mode
# and -t none. The first blkimg result of each case is checked: the base
# must read as the top read before (`qemu-img compare`), `qemu-img check`
# clean, and the emptied top the same size as qemu-img leaves it.
set -uo pipefail
BENCH_NAME="commit"
. "$(dirname "$0")/lib.sh"

title "8. commit: blkimg vs qemu-img (2 GiB qcow2 base, top rewrote half)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
has_subcommand commit || skip "blkimg commit not available"

mib=$(quick 512 2048)
T="$BENCH_DIR/commit-tmpl"
W="$BENCH_DIR/commit-work"
mkdir -p "$T" "$W"

if [ ! -f "$T/top.qcow2" ] || [ "$(qemu-img info --output=json "$T/base.qcow2" 2>/dev/null |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])' 2>/dev/null)" != $((mib * 1048576)) ]; then
    note "creating $T: base $mib MiB random data, top rewriting about half"
    rm -f "$T"/*
    ensure_random_raw "$T/base.raw" "$mib"
    qemu-img convert -f raw -O qcow2 "$T/base.raw" "$T/base.qcow2" || skip "qemu-img convert failed"
    rm -f "$T/base.raw"
    # runs of 64 KiB .. 4 MiB, rewritten or left to the base alike
    half_random_raw "$T/top.raw" "$mib" 8
    # holes of the raw file stay unallocated in the top: the base shows
    qemu-img convert -f raw -O qcow2 "$T/top.raw" "$T/top.qcow2" || skip "qemu-img convert failed"
    rm -f "$T/top.raw"
    qemu-img rebase -u -f qcow2 -b base.qcow2 -F qcow2 "$T/top.qcow2" || skip "qemu-img rebase failed"
fi
top_mib=$(qemu-img info --output=json "$T/top.qcow2" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["actual-size"] >> 20)')
note "base $mib MiB (random data), top $top_mib MiB allocated; $((BENCH_REPS * 2 - 1)) interleaved run(s) per tool and case (median), caches dropped before each run"

fresh() {
    rm -f "$W"/*
    cp "$T/base.qcow2" "$T/top.qcow2" "$W/"
    sync
}

# run1 TOOL OPTS CHECK: one timed commit of a fresh pair; appends to WS CS
# MS; CHECK=1 verifies the result (sets OK).
run1() {
    local tool=$1 opts=$2 check=$3 t w u s m
    fresh
    drop_caches
    # shellcheck disable=SC2086
    timed t "$tool" commit $opts -f qcow2 "$W/top.qcow2"
    if [ -z "$t" ]; then
        OK="commit FAILED"
        return
    fi
    read -r w u s m <<<"$t"
    WS+=("$w")
    CS+=("$(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')")
    MS+=("$m")
    if [ "$check" = 1 ]; then
        if ! qemu-img compare -q -f qcow2 -F qcow2 "$T/top.qcow2" "$W/base.qcow2" >/dev/null 2>&1; then
            OK="base DIFFERENT from the top's view"
        elif ! qemu-img check -q -f qcow2 "$W/base.qcow2" >/dev/null 2>&1 ||
            ! qemu-img check -q -f qcow2 "$W/top.qcow2" >/dev/null 2>&1; then
            OK="qemu-img check FAILED"
        else
            TOPSIZE=$(stat -c %s "$W/top.qcow2")
        fi
    fi
}

both() {
    local opts=$1 i reps=$((BENCH_REPS * 2 - 1))
    local bw=() bc=() bm=() qw=() qc=() qm=()
    OK=ok
    for ((i = 0; i < reps; i++)); do
        local order=("$BLKIMG" qemu-img)
        ((i % 2)) && order=(qemu-img "$BLKIMG")
        for tool in "${order[@]}"; do
            WS=() CS=() MS=()
            TOPSIZE=
            run1 "$tool" "$opts" "$([ "$i" -eq 0 ] && echo 1)"
            if [ "$i" -eq 0 ] && [ -n "$TOPSIZE" ]; then
                if [ "$tool" = qemu-img ]; then QTOP=$TOPSIZE; else BTOP=$TOPSIZE; fi
            fi
            [ ${#WS[@]} -gt 0 ] || continue
            if [ "$tool" = qemu-img ]; then
                qw+=("${WS[0]}") qc+=("${CS[0]}") qm+=("${MS[0]}")
            else
                bw+=("${WS[0]}") bc+=("${CS[0]}") bm+=("${MS[0]}")
            fi
        done
    done
    if [ "$OK" = ok ] && [ "${BTOP:-x}" != "${QTOP:-y}" ]; then
        OK="emptied top ${BTOP:-?} bytes, qemu-img ${QTOP:-?}"
    fi
    pair_summary
}

CASES=(
    "commit default cache|"
    "commit -t none|-t none"
)
printf '  %-22s | %8s %8s %6s | %8s %8s %6s | %8s %8s | %s\n' "case" "wall s" "qemu" "ratio" "cpu s" "qemu" "ratio" "RSS MiB" "qemu" "blkimg result"
for c in "${CASES[@]}"; do
    IFS='|' read -r label opts <<<"$c"
    BTOP= QTOP=
    both "$opts"
    rw=$(ratio "$BW" "$QW")
    rc=$(ratio "$BC" "$QC")
    printf '  %-22s | %8s %8s %6s | %8s %8s %6s | %8s %8s | %s\n' "$label" \
        "$(fmt "$BW" 2)" "$(fmt "$QW" 2)" "$rw" "$(fmt "$BC" 2)" "$(fmt "$QC" 2)" "$rc" "$BM" "$QM" "$OK"
    result "$label" qemu-img "wall s" "$BW" "$QW" "$rw" - -
    result "$label" qemu-img "CPU s" "$BC" "$QC" "$rc" - -
    summary "$label" "wall $rw, CPU $rc (blkimg/qemu-img; $(fmt "$BW" 2) s vs $(fmt "$QW" 2) s); blkimg peak RSS $BM MiB; result $OK"
done
note "ratios are blkimg / qemu-img (lower is better)"
rm -rf "$W"
