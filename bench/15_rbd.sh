#!/bin/bash
# SPDX-License-Identifier: MIT
#
# convert into and out of Ceph RBD (issue 11), blkimg vs qemu-img's rbd
# driver, on the tests' single-node cluster (tests/interop/ceph_cluster.py:
# one monitor, one memstore OSD on 127.0.0.1; joined here and left at the
# end, so the last user stops it):
#   raw -> RBD: convert -n of a raw file about half allocated with random
#       data (BENCH_RBD_MIB, default 1024; 256 with BENCH_QUICK=1) into an
#       RBD image made empty again before every run
#   RBD -> raw: that image back to a local raw file
#   empty 100 GiB RBD -> raw: time proportional to the data, not the size
# Goals: wall <= 0.8x qemu-img both ways; the empty image in about the time
# of a start-up. Every blkimg output is checked with qemu-img compare.
set -uo pipefail
BENCH_NAME="rbd"
. "$(dirname "$0")/lib.sh"

src_mib=${BENCH_RBD_MIB:-$(quick 256 1024)}
title "15. convert into and out of RBD: blkimg vs qemu-img ($src_mib MiB, half allocated; single-node cluster)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
[ -e /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so ] ||
    skip "qemu-img has no rbd driver (qemu-block-extra)"
CLUSTER="$REPO/tests/interop/ceph_cluster.py"
command -v ceph-mon >/dev/null && command -v rbd >/dev/null ||
    skip "ceph-mon / rbd missing"

CEPH_CONF=$("$PY" "$CLUSTER" start 2>"$BENCH_DIR/ceph.err" | tail -n 1)
[ -f "$CEPH_CONF" ] || skip "the cluster did not start: $(tail -n 1 "$BENCH_DIR/ceph.err")"
export CEPH_CONF
RAW="$BENCH_DIR/rbd-half.raw"
OUT="$BENCH_DIR/rbd-out.raw"
IMG=blkimg-bench-$$
cleanup() {
    rbd rm "rbd/$IMG" >/dev/null 2>&1
    rbd rm "rbd/$IMG-empty" >/dev/null 2>&1
    rm -f "$OUT"
    "$PY" "$CLUSTER" release >/dev/null 2>&1
}
trap cleanup EXIT
if [ ! -f "$RAW" ] || [ "$(stat -c %s "$RAW")" -ne $((src_mib << 20)) ]; then
    note "creating $RAW ($src_mib MiB, about half allocated with random data)"
    half_random_raw "$RAW" "$src_mib" 15 || skip "cannot write $RAW"
fi
rbd create --size "${src_mib}M" "rbd/$IMG" && rbd create --size 100G "rbd/$IMG-empty" ||
    skip "rbd create failed"
name() { echo "rbd:rbd/$1:conf=$CEPH_CONF"; }
note "cluster: $CEPH_CONF; $((BENCH_REPS * 2 - 1)) interleaved run(s) per tool (median), caches dropped before each"

# rbd_empty: the target image made empty again (convert -n writes into it).
rbd_empty() {
    rbd rm "rbd/$IMG" >/dev/null 2>&1
    rbd create --size "${src_mib}M" "rbd/$IMG"
}

# same_as_raw TARGET: prints what is wrong when TARGET is not RAW's copy.
same_as_raw() {
    qemu-img compare -q -f raw -F raw "$RAW" "$1" >/dev/null 2>&1 ||
        echo "qemu-img compare: DIFFERENT"
}

# series PREP CHECK CONVERT-ARGS...: convert_pair with PREP run before
# each run, blkimg's first output CHECK (or "-") compared with the source.
series() {
    local prep=$1 check=$2 verify=-
    shift 2
    [ "$check" != - ] && verify="same_as_raw $check"
    PAIR_PREP=$prep convert_pair $((BENCH_REPS * 2 - 1)) "$verify" "$@"
}

printf '  %-26s | %7s %7s %5s | %7s %7s | %s\n' case "wall s" qemu ratio \
    "cpu s" qemu "blkimg output"
row() { # LABEL GOAL
    local r
    r=$(ratio "$BW" "$QW")
    printf '  %-26s | %7s %7s %5s | %7s %7s | %s\n' "$1" "$(fmt "$BW" 2)" \
        "$(fmt "$QW" 2)" "$r" "$(fmt "$BC" 2)" "$(fmt "$QC" 2)" "$OK"
    result "$1" qemu-img "wall s" "$BW" "$QW" "$r" "<=" "$2"
    summary "rbd $1" "wall $r (goal <= $2: $(verdict "$r" "<=" "$2")); output $OK"
}
series rbd_empty "$(name "$IMG")" -n -f raw -O raw "$RAW" "$(name "$IMG")"
row "raw -> RBD (-n)" 0.8
series "" "$OUT" -f raw -O raw "$(name "$IMG")" "$OUT"
row "RBD -> raw" 0.8
series "" - -f raw -O raw "$(name "$IMG-empty")" "$OUT"
row "empty 100 GiB RBD -> raw" 1.0
note "ratios are blkimg / qemu-img (lower is better)"
