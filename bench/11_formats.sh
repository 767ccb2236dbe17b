#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The foreign formats (issue 10), blkimg vs qemu-img side by side: vmdk
# monolithicSparse, vmdk streamOptimized, vhdx dynamic, vpc dynamic and vdi
# dynamic, each made by qemu-img from one raw image about half allocated
# with random data (BENCH_FORMATS_MIB, default 2048 MiB; 512 with
# BENCH_QUICK=1).
#
# - convert each to raw and to qcow2, with -t none -T none and with the
#   default cache modes: wall and CPU (user+sys); goals wall <= 0.7x,
#   CPU <= 0.5x;
# - convert the raw image to each format (streamOptimized compresses),
#   with -t none -T none and with the default cache modes: goal wall
#   <= 0.7x;
# - peak memory (max RSS, /usr/bin/time) of every blkimg convert: goal
#   <= 64 MiB;
# - I/O calls for reading 256 contiguous grains/blocks of each format
#   (blkimg-io --stats), beyond reading one: goal 0 extra
#   (tests/interop/test_format_extents.py asserts the same counts).
#
# Every output blkimg writes is checked with `qemu-img compare` against
# the source (and `qemu-img check` where qemu-img checks the format).
set -uo pipefail
BENCH_NAME="formats"
. "$(dirname "$0")/lib.sh"

src_mib=${BENCH_FORMATS_MIB:-$(quick 512 2048)}
title "11. foreign formats: blkimg vs qemu-img ($src_mib MiB, half allocated, random data)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
has_subcommand convert || skip "blkimg convert not available"

RAW="$BENCH_DIR/fmt-half.raw"
DST="$BENCH_DIR/fmt.out"

# Formats: label | format | file name | create options
FORMATS=(
    "vmdk monolithicSparse|vmdk|fmt-sparse.vmdk|subformat=monolithicSparse"
    "vmdk streamOptimized|vmdk|fmt-stream.vmdk|subformat=streamOptimized"
    "vhdx dynamic|vhdx|fmt-dyn.vhdx|subformat=dynamic"
    "vpc dynamic|vpc|fmt-dyn.vpc|subformat=dynamic"
    "vdi dynamic|vdi|fmt-dyn.vdi|static=off"
)

if [ ! -f "$RAW" ] || [ "$(stat -c %s "$RAW")" -ne $((src_mib << 20)) ]; then
    note "creating $RAW ($src_mib MiB, about half allocated with random data)"
    rm -f "$RAW"
    half_random_raw "$RAW" "$src_mib" 7 || skip "cannot write $RAW"
    for f in "${FORMATS[@]}"; do
        IFS='|' read -r _ _ file _ <<<"$f"
        rm -f "$BENCH_DIR/$file"
    done
fi
for f in "${FORMATS[@]}"; do
    IFS='|' read -r label fmt file opts <<<"$f"
    [ -f "$BENCH_DIR/$file" ] && continue
    note "creating $file (qemu-img convert -O $fmt -o $opts)"
    qemu-img convert -f raw -O "$fmt" -o "$opts" "$RAW" "$BENCH_DIR/$file" ||
        skip "qemu-img convert to $label failed"
done
alloc=$(($(stat -c %b "$RAW") * 512 >> 20))
note "source: $RAW, $src_mib MiB virtual, $alloc MiB allocated; $((BENCH_REPS * 2 - 1)) interleaved run(s) each (median; default cache: $((BENCH_REPS * 3)), compressed targets: $((BENCH_REPS >= 3 ? 3 : 1))), caches dropped before each run"
note "the machine is shared (2 cores, other jobs running): ratios of runs interleaved in one series are what counts, not the absolute times"

# both SRC SFMT TFMT OPTS REPS: convert_pair of SRC to TFMT, verified.
both() {
    # shellcheck disable=SC2086
    convert_pair "$5" "verify_copy $2 $1 $3 $DST" $4 -f "$2" -O "$3" "$1" \
        "$DST"
}

maxrss=0
# measure LABEL SRC SFMT TFMT OPTS CPU_GOAL REPS: one row of the table,
# its records and its summary line (wall goal <= 0.7x; CPU_GOAL "-" for
# none).
measure() {
    local label=$1 cgoal=$6 rw rc goal
    both "$2" "$3" "$4" "$5" "$7"
    rw=$(ratio "$BW" "$QW")
    rc=$(ratio "$BC" "$QC")
    printf '  %-44s | %7s %7s %5s | %7s %7s %5s | %6s %6s | %s\n' "$label" \
        "$(fmt "$BW" 2)" "$(fmt "$QW" 2)" "$rw" "$(fmt "$BC" 2)" \
        "$(fmt "$QC" 2)" "$rc" "$BM" "$QM" "$OK"
    goal="wall $rw (goal <= 0.7: $(verdict "$rw" "<=" 0.7))"
    result "$label" qemu-img "wall s" "$BW" "$QW" "$rw" "<=" 0.7
    if [ "$cgoal" != "-" ]; then
        goal="$goal, CPU $rc (goal <= $cgoal: $(verdict "$rc" "<=" "$cgoal"))"
        result "$label" qemu-img "CPU s" "$BC" "$QC" "$rc" "<=" "$cgoal"
    else
        result "$label" qemu-img "CPU s" "$BC" "$QC" "$rc" - -
    fi
    summary "formats $label" "$goal; blkimg peak RSS $BM MiB; output $OK"
    maxrss=$(awk -v a="$maxrss" -v b="$BM" 'BEGIN{ if (b != "-" && b + 0 > a + 0) print b; else print a }')
}

reps=$((BENCH_REPS * 2 - 1))
creps=$((BENCH_REPS >= 3 ? 3 : 1))
printf '  %-44s | %7s %7s %5s | %7s %7s %5s | %6s %6s | %s\n' "case" \
    "wall s" "qemu" "ratio" "cpu s" "qemu" "ratio" "RSS" "qemu" \
    "blkimg output"
for f in "${FORMATS[@]}"; do
    IFS='|' read -r label fmt file opts <<<"$f"
    for tfmt in raw qcow2; do
        # Default-cache runs are short and the shared disk's drift
        # decides much of each: three times the runs (as bench 7).
        measure "$label->$tfmt -t none -T none" "$BENCH_DIR/$file" \
            "$fmt" "$tfmt" "-t none -T none" 0.5 "$reps"
        measure "$label->$tfmt default cache" "$BENCH_DIR/$file" \
            "$fmt" "$tfmt" "" 0.5 "$((BENCH_REPS * 3))"
    done
done
for f in "${FORMATS[@]}"; do
    IFS='|' read -r label fmt file opts <<<"$f"
    r=$reps
    case "$opts" in *stream*) r=$creps ;; esac
    # -t none -T none as well: the default cache's figures are the page
    # cache's (kernel copies whose speed swings threefold between
    # identical runs on the shared host), these the formats' own
    measure "raw->$label -t none -T none" "$RAW" raw "$fmt" \
        "-t none -T none -o $opts" - "$r"
    measure "raw->$label default cache" "$RAW" raw "$fmt" "-o $opts" - "$r"
done
note "ratios are blkimg / qemu-img (lower is better); peak memory of blkimg convert: $maxrss MiB (goal <= 64: $(verdict "$maxrss" "<=" 64))"
result "peak RSS of any convert" "64 MiB" "MiB" "$maxrss" 64 \
    "$(ratio "$maxrss" 64)" "<=" 1
summary "formats peak memory" "blkimg max RSS over all cases $maxrss MiB (goal <= 64: $(verdict "$maxrss" "<=" 64))"

# I/O calls for reading N contiguous grains/blocks of an image whose
# first 256 are allocated in one write (the allocation is one host run).
# Formats: label | format | create options | grain/block KiB
EXTENTS=(
    "vmdk monolithicSparse|vmdk|subformat=monolithicSparse|64"
    "vhdx dynamic|vhdx|subformat=dynamic,block_size=1M|1024"
    "vpc dynamic|vpc|subformat=dynamic|2048"
    "vdi dynamic|vdi|static=off|1024"
)
echo
note "I/O calls for reading N contiguous grains/blocks (blkimg-io --stats -t none; beyond reading one)"
printf '  %-24s %8s %8s %8s %8s\n' format 1 16 64 256
IMG="$BENCH_DIR/extents.img"
for e in "${EXTENTS[@]}"; do
    IFS='|' read -r label fmt opts kib <<<"$e"
    rm -f "$IMG"
    if ! "$BLKIMG" create -q -f "$fmt" -o "$opts" "$IMG" "$((kib * 257))K" ||
        ! "$BLKIMG_IO" -f "$fmt" -t none -c "write -P 0x5a 0 $((kib * 256))K" \
            "$IMG" >/dev/null; then
        note "$label: cannot make the image"
        continue
    fi
    calls() {
        "$BLKIMG_IO" --stats -r -f "$fmt" -t none -c "read 0 $(($1 * kib))K" \
            "$IMG" 2>/dev/null | sed -n 's/^ *io calls: \([0-9]*\)$/\1/p' |
            tail -n 1
    }
    base=$(calls 1)
    row=()
    for n in 1 16 64 256; do
        row+=($(($(calls "$n") - base)))
    done
    printf '  %-24s %8s %8s %8s %8s\n' "$label" "${row[@]}"
    result "$label: extra I/Os reading 256 blocks" \
        "block-at-a-time reading" "I/O calls" "${row[3]}" 255 \
        "$(ratio "${row[3]}" 255)" - -
    summary "formats $label extents" "reading 256 contiguous grains/blocks cost ${row[3]} I/Os beyond reading 1 (block-at-a-time: 255)"
done
note "vpc keeps a sector bitmap in front of every block: no two of its blocks are host-contiguous, so one I/O per block is its least"
rm -f "$IMG" "$DST"
