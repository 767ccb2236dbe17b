#!/bin/bash
# SPDX-License-Identifier: MIT
#
# convert, blkimg vs qemu-img, on a 2 GiB qcow2 about half allocated with
# random data: wall time, CPU time (user+sys) and peak memory (max RSS,
# /usr/bin/time). Every output blkimg writes is checked with
# `qemu-img compare` against the source (and `qemu-img check` for qcow2).
# Goals: -t none -T none: wall <= 0.8x, CPU <= 0.6x; default cache modes:
# wall <= 0.9x; -c: wall <= 0.6x; empty 1 TiB qcow2 -> raw: wall <= 1x;
# peak memory <= 64 MiB.
set -uo pipefail
BENCH_NAME="convert"
. "$(dirname "$0")/lib.sh"

title "7. convert: blkimg vs qemu-img (2 GiB qcow2, half allocated, random data)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
has_subcommand convert || skip "blkimg convert not available"

SRC_Q="$BENCH_DIR/half2g.qcow2"
EMPTY="$BENCH_DIR/empty1t.qcow2"
DST="$BENCH_DIR/convert.out"
src_mib=$(quick 512 2048)

ensure_half_qcow2 "$SRC_Q" "$src_mib" || skip "qemu-img convert failed"
rm -f "$EMPTY"
qemu-img create -q -f qcow2 "$EMPTY" 1T

alloc=$(qemu-img info --output=json "$SRC_Q" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["actual-size"] >> 20)')
note "source: $SRC_Q, $src_mib MiB virtual, $alloc MiB allocated; $((BENCH_REPS * 2 - 1)) interleaved run(s) each (median; default cache: $((BENCH_REPS * 3)), -c: $((BENCH_REPS >= 3 ? 3 : 1))), caches dropped before each run"

# Cases: label | goal op | wall goal | cpu goal | source | source fmt | target fmt | convert options
CASES=(
    "qcow2->raw -t none -T none|<=|0.8|0.6|$SRC_Q|qcow2|raw|-t none -T none"
    "qcow2->qcow2 -t none -T none|<=|0.8|0.6|$SRC_Q|qcow2|qcow2|-t none -T none"
    "qcow2->raw default cache|<=|0.9|-|$SRC_Q|qcow2|raw|"
    "qcow2->qcow2 default cache|<=|0.9|-|$SRC_Q|qcow2|qcow2|"
    "qcow2->qcow2 -c (compressed)|<=|0.6|-|$SRC_Q|qcow2|qcow2|-c"
    "empty 1 TiB qcow2->raw|<=|1.0|-|$EMPTY|qcow2|raw|"
)

# both SRC SFMT TFMT OPTS: convert_pair of SRC to TFMT, verified.
both() {
    local reps=$((BENCH_REPS * 2 - 1))
    # Compression runs take 10 to 25 s: three keep the bench short, and
    # one alone was at the mercy of the shared host.
    # Default-cache runs last about half a second, and the disk's drift
    # (reading the source alone takes 0.26 to 0.72 s) decides much of
    # each: nine runs give a steadier median.
    case "$4" in
    *-c*) reps=$((BENCH_REPS >= 3 ? 3 : 1)) ;;
    *none*) ;;
    *) reps=$((BENCH_REPS * 3)) ;;
    esac
    # shellcheck disable=SC2086
    convert_pair "$reps" "verify_copy $2 $1 $3 $DST" $4 -f "$2" -O "$3" \
        "$1" "$DST"
}

printf '  %-30s | %8s %8s %6s | %8s %8s %6s | %8s %8s | %s\n' "case" "wall s" "qemu" "ratio" "cpu s" "qemu" "ratio" "RSS MiB" "qemu" "blkimg output"
maxrss="0"
for c in "${CASES[@]}"; do
    IFS='|' read -r label op wgoal cgoal src sfmt tfmt opts <<<"$c"
    both "$src" "$sfmt" "$tfmt" "$opts"
    bw=$BW bc=$BC bm=$BM bok=$OK qw=$QW qc=$QC qm=$QM
    rw=$(ratio "$bw" "$qw")
    rc=$(ratio "$bc" "$qc")
    printf '  %-30s | %8s %8s %6s | %8s %8s %6s | %8s %8s | %s\n' "$label" \
        "$(fmt "$bw" 2)" "$(fmt "$qw" 2)" "$rw" "$(fmt "$bc" 2)" "$(fmt "$qc" 2)" "$rc" "$bm" "$qm" "$bok"
    goal="wall $rw (goal $op $wgoal: $(verdict "$rw" "$op" "$wgoal"))"
    if [ "$cgoal" != "-" ]; then
        goal="$goal, CPU $rc (goal $op $cgoal: $(verdict "$rc" "$op" "$cgoal"))"
    fi
    result "$label" qemu-img "wall s" "$bw" "$qw" "$rw" "$op" "$wgoal"
    if [ "$cgoal" != "-" ]; then
        result "$label" qemu-img "CPU s" "$bc" "$qc" "$rc" "$op" "$cgoal"
    else
        result "$label" qemu-img "CPU s" "$bc" "$qc" "$rc" - -
    fi
    result "$label" qemu-img "peak RSS MiB" "$bm" "$qm" "$(ratio "$bm" "$qm")" - -
    summary "convert $label" "$goal; blkimg peak RSS $bm MiB; output $bok"
    maxrss=$(awk -v a="$maxrss" -v b="$bm" 'BEGIN{ if (b != "-" && b + 0 > a + 0) print b; else print a }')
done
note "ratios are blkimg / qemu-img (lower is better); peak memory of blkimg convert: $maxrss MiB (goal <= 64: $(verdict "$maxrss" "<=" 64))"
summary "convert peak memory" "blkimg max RSS over all cases $maxrss MiB (goal <= 64: $(verdict "$maxrss" "<=" 64))"
rm -f "$EMPTY" "$DST"
