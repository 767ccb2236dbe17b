#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Seed 004's effect, made visible: reading N host-contiguous qcow2 clusters
# should cost one data I/O, whatever N. blkimg-io --stats counts the I/O
# calls on the protocol node; the table shows them for reads of 1 to 256
# clusters (64 KiB each) of a fully allocated qcow2, cache=none. The
# 1-cluster read is the baseline (it includes opening the image: header,
# L1 and L2 table reads), so "extra I/Os" is what reading more clusters
# cost beyond that.
set -uo pipefail
BENCH_NAME="qcow2-extents"
. "$(dirname "$0")/lib.sh"

title "6. qcow2 reads of N contiguous clusters: I/O calls (blkimg-io --stats, seed 004)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"

RAW="$BENCH_DIR/raw1g.img"
QCOW2="$BENCH_DIR/raw1g.qcow2"
ensure_random_raw "$RAW" 1024
if [ ! -f "$QCOW2" ] || [ "$QCOW2" -ot "$RAW" ]; then
    note "creating $QCOW2 (qemu-img convert, 64 KiB clusters, fully allocated)"
    qemu-img convert -f raw -O qcow2 "$RAW" "$QCOW2" || skip "qemu-img convert failed"
fi
"$BLKIMG_IO" --stats -f qcow2 -t none -c "read 0 64k" "$QCOW2" >/dev/null 2>&1 ||
    skip "blkimg-io cannot read qcow2 images yet ($("$BLKIMG_IO" -f qcow2 -c "read 0 64k" "$QCOW2" 2>&1 | head -n 1))"

calls() { # LENGTH_IN_CLUSTERS -> io calls
    "$BLKIMG_IO" --stats -f qcow2 -t none -c "read 0 $(($1 * 65536))" "$QCOW2" 2>/dev/null |
        sed -n 's/^ *io calls: \([0-9]*\)$/\1/p' | tail -n 1
}

base=$(calls 1)
[ -n "$base" ] || skip "blkimg-io --stats printed no 'io calls' line"
printf '  %-10s %12s %10s %12s\n' clusters "read bytes" "io calls" "extra I/Os"
worst=0
for n in 1 2 16 64 256; do
    c=$(calls "$n")
    extra=$((c - base))
    ((extra > worst)) && worst=$extra
    printf '  %-10s %12s %10s %12s\n' "$n" "$((n * 65536))" "$c" "$extra"
done
note "cluster-at-a-time reading would need 255 extra I/Os for 256 clusters; blkimg needed $worst"
result "extra I/Os reading 256 contiguous clusters" \
    "cluster-at-a-time reading" "I/O calls" "$worst" 255 \
    "$(ratio "$worst" 255)" - -
summary "$BENCH_NAME" "reading 256 contiguous clusters cost $worst I/Os beyond reading 1 (cluster-at-a-time: 255)"
