#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Serving an image over NBD: blkimg-nbd (nbdkit with the blkimg plugin) vs
# qemu-nbd, both read-only on a Unix socket, serving the 1 GiB qcow2 about
# half allocated with random data (bench 7's kind of image):
#   sequential: nbdcopy reading the whole export into null: (it asks for
#       block status and skips the holes; 4 connections: both servers
#       allow multi-conn)
#   random: 4 KiB random reads at queue depth 32 for a fixed time, with
#       fio's nbd engine (or, without it, nbdcopy with 4 connections and
#       4 KiB requests, timed)
# Servers are started for each run and killed by PID; runs are interleaved
# (the order alternating), caches dropped before each, medians reported.
# Goals: sequential wall <= 1.0x qemu-nbd, random IOPS >= 1.0x qemu-nbd.
set -uo pipefail
BENCH_NAME="nbd serve"
. "$(dirname "$0")/lib.sh"

src_mib=$(quick 256 1024)
title "12. serving over NBD: blkimg-nbd (nbdkit + plugin) vs qemu-nbd ($src_mib MiB qcow2, half allocated)"
need_tools
BLKIMG_NBD="$BUILD/blkimg-nbd"
[ -x "$BLKIMG_NBD" ] || skip "$BLKIMG_NBD not built"
command -v qemu-nbd >/dev/null || skip "qemu-nbd missing"
command -v nbdkit >/dev/null || skip "nbdkit missing"
command -v nbdcopy >/dev/null || skip "nbdcopy missing"

fio_secs=$(quick 3 5)
SRC="$BENCH_DIR/half${src_mib}m.qcow2"
SOCK="$BENCH_DIR/serve.sock"
URL="nbd+unix:///exp?socket=$SOCK"
ensure_half_qcow2 "$SRC" "$src_mib" || skip "qemu-img convert failed"

FIO_NBD=0
if command -v fio >/dev/null && fio --enghelp 2>/dev/null | grep -qx '[[:space:]]*nbd'; then
    FIO_NBD=1
fi

SERVER_PID=
# serve TOOL: TOOL (blkimg-nbd or qemu-nbd) serving $SRC read-only.
serve() {
    local tool=$1 i
    stop_server
    rm -f "$SOCK"
    "$tool" -r -t -e 8 -f qcow2 -x exp -k "$SOCK" "$SRC" </dev/null \
        >/dev/null 2>"$BENCH_DIR/serve.err" &
    SERVER_PID=$!
    for ((i = 0; i < 1000; i++)); do
        [ -S "$SOCK" ] && nbdinfo --size "$URL" >/dev/null 2>&1 && return 0
        sleep 0.01
    done
    echo "  $tool did not start" >&2
    sed 's/^/    /' "$BENCH_DIR/serve.err" | head -n 5 >&2
}
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=
    fi
}
trap 'stop_server; rm -f "$SOCK"' EXIT

# one_run CASE TOOL: one measured run; sets VAL ("" on a failure): wall
# seconds for seq, IOPS for rand.
one_run() {
    local case=$1 tool=$2 t
    VAL=
    serve "$tool"
    drop_caches
    if [ "$case" = seq ]; then
        timed t nbdcopy --connections=4 "$URL" null:
        VAL=${t%% *}
    elif [ "$FIO_NBD" = 1 ]; then
        if fio --name=rr --ioengine=nbd --uri="$URL" --rw=randread --bs=4k \
            --iodepth=32 --size="${src_mib}M" --time_based \
            --runtime="$fio_secs" --norandommap --randrepeat=0 \
            --output-format=json --output="$BENCH_DIR/fio.json" \
            </dev/null >/dev/null 2>&1; then
            VAL=$("$PY" -c 'import json,sys
j = json.load(open(sys.argv[1]))
print("%.0f" % sum(x["read"]["iops"] for x in j["jobs"]))' "$BENCH_DIR/fio.json")
        fi
    else
        timed t nbdcopy --connections=4 --request-size=4096 --requests=8 \
            "$URL" null:
        [ -n "$t" ] && VAL=$(awk -v w="${t%% *}" -v m="$src_mib" \
            'BEGIN { printf "%.0f", m * 256 / 2 / w }')
    fi
    stop_server
}

rand_how="fio nbd engine, ${fio_secs}s per run"
[ "$FIO_NBD" = 1 ] || rand_how="nbdcopy, 4 connections of 4 KiB requests (fio has no nbd engine)"
note "source: $SRC ($src_mib MiB virtual); $((BENCH_REPS * 2 - 1)) interleaved run(s) per server, medians, caches dropped before each run"
note "random reads: $rand_how"
printf '  %-26s | %10s %10s %6s | %s\n' "case" "blkimg" "qemu-nbd" "ratio" "goal"

for case in seq rand; do
    tools=("$BLKIMG_NBD" qemu-nbd)
    bv=() qv=()
    for ((i = 0; i < BENCH_REPS * 2 - 1; i++)); do
        order=("${tools[@]}")
        ((i % 2)) && order=("${tools[1]}" "${tools[0]}")
        for tool in "${order[@]}"; do
            one_run "$case" "$tool"
            [ -n "$VAL" ] || continue
            if [ "$tool" = qemu-nbd ]; then qv+=("$VAL"); else bv+=("$VAL"); fi
        done
    done
    BV=- QV=-
    [ ${#bv[@]} -gt 0 ] && BV=$(median "${bv[@]}")
    [ ${#qv[@]} -gt 0 ] && QV=$(median "${qv[@]}")
    r=$(ratio "$BV" "$QV")
    if [ "$case" = seq ]; then
        label="nbdcopy read, wall s"
        printf '  %-26s | %10s %10s %6s | %s\n' "$label" "$(fmt "$BV" 2)" \
            "$(fmt "$QV" 2)" "$r" "<= 1.0 ($(verdict "$r" "<=" 1.0))"
        result "nbdcopy read" qemu-nbd "wall s" "$BV" "$QV" "$r" "<=" 1.0
        summary "nbd serve nbdcopy read" "wall $r x qemu-nbd (goal <= 1.0: $(verdict "$r" "<=" 1.0))"
    else
        label="4k random read QD32, IOPS"
        printf '  %-26s | %10s %10s %6s | %s\n' "$label" "$(fmt "$BV")" \
            "$(fmt "$QV")" "$r" ">= 1.0 ($(verdict "$r" ">=" 1.0))"
        result "4k random read QD32" qemu-nbd "IOPS" "$BV" "$QV" "$r" ">=" 1.0
        summary "nbd serve 4k randread" "IOPS $r x qemu-nbd (goal >= 1.0: $(verdict "$r" ">=" 1.0))"
    fi
done
note "seq: blkimg's wall time / qemu-nbd's (lower is better); rand: IOPS ratio (higher is better)"
