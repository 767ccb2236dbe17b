#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Block 0 a hole on 512-byte-sector storage: 2,000 512-byte O_DIRECT writes
# at random 512-aligned offsets, blkimg-io -t none vs qemu-io -t none, on an
# ext4 file system on a loop device (default 512-byte logical sectors).
# Counts the sectors the loop device moved (/sys/block/loopN/stat). QEMU 7.2
# cannot detect the alignment of a file whose block 0 is a hole, falls back
# to 4096 and turns every write into a 4 KiB read-modify-write.
# Goal: blkimg-io moves at most 0.15x the sectors qemu-io moves.
set -uo pipefail
BENCH_NAME="hole-block0"
. "$(dirname "$0")/lib.sh"

title "2. Block 0 a hole, 512-byte sectors: $(quick 500 2,000) x 512-byte O_DIRECT writes"
need_tools
command -v qemu-io >/dev/null || skip "qemu-io missing"
[ "$(id -u)" -eq 0 ] || skip "needs root (loop device, mount)"
command -v mkfs.ext4 >/dev/null || skip "mkfs.ext4 missing"

WORK=$(mktemp -d /tmp/blkimg-bench-hole.XXXXXX)
LOOP=""
cleanup() {
    if mountpoint -q "$WORK/mnt" 2>/dev/null; then
        umount "$WORK/mnt" 2>/dev/null || umount -l "$WORK/mnt"
    fi
    [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

truncate -s 1G "$WORK/backing"
LOOP=$(losetup -f --show "$WORK/backing") || skip "losetup failed"
DEV=$(basename "$LOOP")
lss=$(cat "/sys/block/$DEV/queue/logical_block_size")
# No lazy initialisation: a kernel thread writing inode tables in the
# background would add device sectors to whatever runs meanwhile.
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP" ||
    skip "mkfs.ext4 failed"
mkdir "$WORK/mnt"
mount "$LOOP" "$WORK/mnt" || skip "mount failed"

nwrites=$(quick 500 2000)
SIZE_MIB=64
IMG="$WORK/mnt/disk.img"
note "$LOOP: ${lss}-byte logical sectors, ext4; image $SIZE_MIB MiB, block 0 a hole, rest allocated"

# The image: every block allocated except block 0 (so that the writes
# themselves allocate nothing and only alignment decides what moves).
make_image() {
    rm -f "$IMG"
    truncate -s "${SIZE_MIB}M" "$IMG"
    dd if=/dev/zero of="$IMG" bs=4096 seek=1 count=$((SIZE_MIB * 256 - 1)) \
        conv=notrunc status=none
    sync
}

# The same random 512-aligned offsets (beyond block 0) for both tools.
"$PY" - "$nwrites" "$SIZE_MIB" >"$WORK/cmds" <<'PYEOF'
import random, sys
n, mib = int(sys.argv[1]), int(sys.argv[2])
r = random.Random(2)
for i in range(n):
    off = r.randrange(8, mib * 2048) * 512
    print("write -P 0x%02x %d 512" % (i % 255 + 1, off))
PYEOF
args=()
while read -r line; do args+=(-c "$line"); done <"$WORK/cmds"

sectors() {
    awk '{print $3, $7}' "/sys/block/$DEV/stat"
}

# blkimg-io's own counters (--stats), when it has them.
stats=()
make_image
if "$BLKIMG_IO" --stats -f raw -t none -c "read 4096 512" "$IMG" >/dev/null 2>&1; then
    stats=(--stats)
fi

# measure TOOL [OPTIONS...]: sets R_SECT W_SECT SECS
measure() {
    local tool=$1 before after t0 t1
    shift
    make_image
    drop_caches
    before=$(sectors)
    t0=$(date +%s.%N)
    if ! "$tool" "$@" -f raw -t none "${args[@]}" "$IMG" >"$WORK/out" 2>&1; then
        echo "  $tool failed:" >&2
        head -n 5 "$WORK/out" | sed 's/^/    /' >&2
        R_SECT=""; W_SECT=""; SECS=""
        return
    fi
    t1=$(date +%s.%N)
    sync
    after=$(sectors)
    read -r rb wb <<<"$before"
    read -r ra wa <<<"$after"
    R_SECT=$((ra - rb))
    W_SECT=$((wa - wb))
    SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}')
    if grep -q "Pattern verification failed\|error\|Error" "$WORK/out"; then
        echo "  $tool reported errors:" >&2
        grep -m 3 "failed\|rror" "$WORK/out" | sed 's/^/    /' >&2
    fi
}

declare -A RS WS TS
for tool in blkimg-io qemu-io; do
    cmd=(qemu-io)
    [ "$tool" = blkimg-io ] && cmd=("$BLKIMG_IO" "${stats[@]}")
    rs=() ws=() ts=()
    for ((i = 0; i < BENCH_REPS; i++)); do
        measure "${cmd[@]}"
        [ -n "$R_SECT" ] || break
        rs+=("$R_SECT"); ws+=("$W_SECT"); ts+=("$SECS")
        if [ "$tool" = blkimg-io ] && [ ${#stats[@]} -gt 0 ]; then
            STATS_LINE=$(sed -n 's/^ *\(rmw operations\|bounced bytes\|io calls\): \([0-9]*\)$/\1 \2/p' "$WORK/out" | paste -sd, | sed 's/,/, /g')
        fi
    done
    if [ ${#rs[@]} -eq 0 ]; then
        RS[$tool]="-"; WS[$tool]="-"; TS[$tool]="-"
    else
        RS[$tool]=$(median "${rs[@]}"); WS[$tool]=$(median "${ws[@]}")
        TS[$tool]=$(median "${ts[@]}")
    fi
done

# Cross-check: the data blkimg-io wrote reads back in qemu-io.
make_image
"$BLKIMG_IO" -f raw -t none "${args[@]}" "$IMG" >/dev/null 2>&1
vargs=()
while read -r _ _ pat off len; do
    vargs+=(-c "read -P $pat $off $len")
done < <(tac "$WORK/cmds" | awk '!seen[$4]++' | tac)
if qemu-io -f raw "${vargs[@]}" "$IMG" 2>&1 | grep -q "Pattern verification failed"; then
    verify="FAILED (qemu-io read back different data)"
else
    verify="ok (qemu-io read back every pattern)"
fi

total() { awk -v a="${RS[$1]}" -v b="${WS[$1]}" 'BEGIN{ if (a == "-") print "-"; else print a + b }'; }
per() { awk -v t="$(total "$1")" -v n="$nwrites" 'BEGIN{ if (t == "-") print "-"; else printf "%.2f", t / n }'; }

printf '  %-10s %12s %12s %12s %14s %8s\n' tool "read sect" "write sect" "total" "sect/write" "seconds"
for tool in blkimg-io qemu-io; do
    printf '  %-10s %12s %12s %12s %14s %8s\n' "$tool" "${RS[$tool]}" "${WS[$tool]}" \
        "$(total "$tool")" "$(per "$tool")" "${TS[$tool]}"
done
r=$(ratio "$(total blkimg-io)" "$(total qemu-io)")
note "sectors moved, blkimg-io / qemu-io = $r (goal <= 0.15: $(verdict "$r" "<=" 0.15))"
[ -n "${STATS_LINE:-}" ] && note "blkimg-io --stats: $STATS_LINE"
note "read-back of blkimg-io's writes: $verify"
result "512-byte O_DIRECT writes, block 0 a hole" qemu-io \
    "device sectors moved" "$(total blkimg-io)" "$(total qemu-io)" "$r" "<=" 0.15
summary "$BENCH_NAME" "device sectors blkimg-io/qemu-io = $r (goal <= 0.15: $(verdict "$r" "<=" 0.15)); $(per blkimg-io) vs $(per qemu-io) sectors per 512-byte write; read-back $verify"
